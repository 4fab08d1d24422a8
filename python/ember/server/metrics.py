"""GET /metrics: Prometheus' text format, by hand (no client library). The engine's own counters
(requests running and waiting, tokens in and out, KV blocks, prefix cache) are read at scrape time
from AsyncLLMEngine.stats(); the latencies only the server sees (time to first token, between
tokens, whole request) are histograms it fills as outputs arrive."""
from __future__ import annotations

import bisect
import time
from typing import Dict, List, Optional, Sequence

from ..outputs import RequestOutput

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)

# (engine stats key, metric name, type, help)
_ENGINE_METRICS = (
    ("running", "num_requests_running", "gauge", "Sequences decoding in the batch."),
    ("waiting", "num_requests_waiting", "gauge", "Sequences waiting for a slot or KV blocks."),
    ("prompt_tokens", "prompt_tokens_total", "counter", "Prompt tokens the engine computed."),
    ("generation_tokens", "generation_tokens_total", "counter", "Tokens the engine generated."),
    ("kv_blocks_total", "kv_blocks_total", "gauge", "KV blocks in the pool."),
    ("kv_blocks_used", "kv_blocks_used", "gauge", "KV blocks held by running sequences."),
    ("kv_blocks_cached", "kv_blocks_cached", "gauge", "Free KV blocks still findable by the prefix cache."),
    ("prefix_cache_queries", "prefix_cache_queries_total", "counter", "Prefix-cache lookups of full prompt blocks."),
    ("prefix_cache_hits", "prefix_cache_hits_total", "counter", "Prefix-cache lookups that found the block."),
    ("cached_prompt_tokens", "cached_prompt_tokens_total", "counter", "Prompt tokens served by the prefix cache."),
    ("preemptions", "preemptions_total", "counter", "Sequences preempted when KV blocks ran out."),
    ("swaps_out", "kv_swaps_out_total", "counter", "Preempted sequences swapped out to the host tier."),
    ("swaps_in", "kv_swaps_in_total", "counter", "Swapped-out sequences brought back from the host tier."),
    ("host_blocks_total", "kv_host_blocks_total", "gauge", "Slots of the host tier (--kv-host-mb)."),
    ("host_blocks_used", "kv_host_blocks_used", "gauge", "Host slots held by swapped-out sequences."),
    ("host_blocks_cached", "kv_host_blocks_cached", "gauge", "Host slots holding evicted prefix-cache blocks."),
    ("host_cache_hits", "kv_host_cache_hits_total", "counter", "Prefix blocks served from the host tier."),
    ("steps", "engine_steps_total", "counter", "Forward steps of the engine."),
    ("seconds_schedule", "engine_schedule_seconds_total", "counter", "Time the engine loop spent planning steps."),
    ("seconds_forward", "engine_forward_seconds_total", "counter", "Time the engine loop spent in forward steps."),
    ("seconds_sample", "engine_sample_seconds_total", "counter", "Time the engine loop spent sampling."),
    ("seconds_output", "engine_output_seconds_total", "counter", "Time the engine loop spent handing out outputs."),
)

PREFIX = "ember:"


class Histogram:
    def __init__(self, name: str, help: str, buckets: Sequence[float]):
        self.name, self.help, self.buckets = PREFIX + name, help, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)   # the last: above every bucket
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def lines(self) -> List[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, n in zip(self.buckets, self.counts):
            total += n
            out.append(f'{self.name}_bucket{{le="{bound}"}} {total}')
        out += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum}",
                f"{self.name}_count {self.count}"]
        return out


class Metrics:
    """The server's counters and histograms; everything runs on the event loop, so no lock."""

    def __init__(self):
        self.ttft = Histogram("time_to_first_token_seconds", "Time from request to its first token.", TTFT_BUCKETS)
        self.itl = Histogram("inter_token_latency_seconds", "Time between a sequence's tokens.", ITL_BUCKETS)
        self.e2e = Histogram("e2e_request_latency_seconds", "Time from request to its last token.", E2E_BUCKETS)
        self.requests: Dict[str, int] = {}   # finish reason (or "error", "rejected") -> count

    def count(self, outcome: str) -> None:
        self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def render(self, stats: Optional[dict]) -> str:
        lines = []
        for key, name, kind, help in _ENGINE_METRICS if stats else ():
            lines += [f"# HELP {PREFIX}{name} {help}", f"# TYPE {PREFIX}{name} {kind}", f"{PREFIX}{name} {stats[key]}"]
        name = PREFIX + "requests_total"
        lines += [f"# HELP {name} HTTP generation requests by outcome (finish reason, error, rejected).",
                  f"# TYPE {name} counter"]
        lines += [f'{name}{{outcome="{k}"}} {v}' for k, v in sorted(self.requests.items())]
        for h in (self.ttft, self.itl, self.e2e):
            lines += h.lines()
        return "\n".join(lines) + "\n"


class RequestTimer:
    """Feeds one request's timings into Metrics as its outputs arrive. A step that brings a
    sequence several tokens at once counts each at the gap divided among them."""

    def __init__(self, metrics: Metrics):
        self._m = metrics
        self.start = time.perf_counter()
        self.first_token_s: Optional[float] = None
        self._seen: Dict[int, tuple] = {}   # choice -> (tokens seen, when the last came)

    def observe(self, out: RequestOutput, first_choice: int = 0) -> None:
        """Takes in out, whose sequence j is the request's choice first_choice + j (several
        prompts: each prompt's sequences follow the previous prompt's)."""
        now = time.perf_counter()
        for o in out.outputs:
            choice = first_choice + o.index
            seen, last = self._seen.get(choice, (0, self.start))
            new = len(o.token_ids) - seen
            if new <= 0:
                continue
            if seen == 0:   # the first token's wait is time to first token, not between tokens
                if self.first_token_s is None:
                    self.first_token_s = now - self.start
                    self._m.ttft.observe(self.first_token_s)
                new -= 1
            if new > 0:
                self._m.itl.observe((now - last) / new, new)
            self._seen[choice] = (len(o.token_ids), now)

    def finish(self, outcome: str) -> float:
        """Counts the request; returns its duration in seconds."""
        elapsed = time.perf_counter() - self.start
        self._m.count(outcome)
        if outcome in ("stop", "length"):
            self._m.e2e.observe(elapsed)
        return elapsed
