"""ember-bench --serving URL: load any OpenAI-compatible server (ember-server, llama-server, vLLM)
with N streamed /v1/completions requests, C at a time, and print its throughput and latencies.

Each request's prompt is a random number of random words from a fixed list and asks for a random
number of tokens (max_tokens, with ignore_eos so the server generates them all), both drawn from
--seed, so two servers see the same requests. Output tokens are counted from the usage of the last
chunk (stream_options.include_usage) where the server sends it, else as the chunks that carry text.
TTFT is the time from sending a request to its first text; ITL the time between a request's
text chunks (a chunk carrying several tokens counts once, as in vLLM's benchmark); TPOT a
request's time after its first token divided by its other tokens.

Only the standard library is used (threads, http.client, server-sent events read by hand), so this
file also runs on its own, where ember is not installed: python bench_serving.py --serving URL.
"""
from __future__ import annotations

import argparse
import http.client
import json
import queue
import random
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Tuple

PROG = "ember-bench"

# The prompts' vocabulary: plain words that every tokenizer splits into one or two tokens.
WORDS = tuple("""
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level office door health
person art war history party result change morning reason research girl guy moment air teacher force
education foot boy age policy process music market sense nation plan college interest death experience
effect use class control care field development role effort rate heart drug show leader light voice
wife police mind price report decision son view relationship town road arm difference value building
action model season society tax director position player record paper space ground form event official
matter center couple site project activity star table need court oil situation cost industry figure
street image phone data picture practice piece land product doctor wall patient worker news test movie
north love support technology step baby computer type attention film tree source organization hair
window evidence population truth song energy river garden bridge winter summer island mountain ocean
""".split())


@dataclass
class Request:
    prompt: str
    words: int
    max_tokens: int


@dataclass
class Result:
    """One request as the client saw it (times in seconds from its send)."""
    asked: int
    ok: bool = False
    error: str = ""
    output_tokens: int = 0
    from_usage: bool = False              # output_tokens came from the usage, not from counting chunks
    prompt_tokens: Optional[int] = None   # from the usage, where the server sent one
    ttft: Optional[float] = None
    itl: List[float] = field(default_factory=list)
    latency: float = 0.0


def make_requests(n: int, words: Tuple[int, int], tokens: Tuple[int, int], seed: int) -> List[Request]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(*words)
        out.append(Request(" ".join(rng.choice(WORDS) for _ in range(k)), k, rng.randint(*tokens)))
    return out


class Endpoint:
    """The server: base URL as given (http://host:port, .../v1, or .../v1/completions)."""

    def __init__(self, url: str, api_key: Optional[str], timeout: float):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the URL must look like http://HOST:PORT, got {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        path = parts.path.rstrip("/")
        if path.endswith("/completions"):
            path = path[:-len("/completions")]
        self.v1 = path if path.endswith("/v1") else path + "/v1"
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout)

    def send(self, conn, method: str, route: str, body: Optional[dict] = None) -> http.client.HTTPResponse:
        conn.request(method, self.v1 + route, None if body is None else json.dumps(body), self._headers)
        return conn.getresponse()

    def served_model(self) -> Optional[str]:
        """The first model of GET /v1/models; None where the server does not list any. Raises
        ConnectionError with one line where the server cannot be reached or refuses the key."""
        conn = self.connect()
        try:
            r = self.send(conn, "GET", "/models")
            text = r.read().decode("utf-8", "replace")
        except OSError as e:
            raise ConnectionError(f"cannot reach {self.url}: {e}") from None
        finally:
            conn.close()
        if r.status in (401, 403):
            raise ConnectionError(f"{self.url} refused the API key ({r.status}): {error_message(text)}")
        try:
            return json.loads(text)["data"][0]["id"] if r.status == 200 else None
        except (ValueError, KeyError, IndexError, TypeError):
            return None


def error_message(text: str) -> str:
    """The message of an OpenAI error body, else the text's start."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return " ".join(text.split())[:200]


def sse_data(response) -> Iterator[str]:
    """The data of each server-sent event (its data lines joined), until the stream ends."""
    data: List[str] = []
    for raw in response:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def run_one(endpoint: Endpoint, body: dict) -> Result:
    result = Result(asked=body["max_tokens"])
    chunks, usage_tokens, done = 0, None, False
    conn = endpoint.connect()
    t0 = last = time.perf_counter()
    try:
        r = endpoint.send(conn, "POST", "/completions", body)
        if r.status != 200:
            result.error = f"HTTP {r.status}: {error_message(r.read().decode('utf-8', 'replace'))}"
            return result
        for data in sse_data(r):
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                err = event["error"]
                result.error = f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
                return result
            now = time.perf_counter()
            if any(c.get("text") for c in event.get("choices") or ()):
                if result.ttft is None:
                    result.ttft = now - t0
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
            usage = event.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = usage["completion_tokens"]
                result.prompt_tokens = usage.get("prompt_tokens")
    except (OSError, http.client.HTTPException, ValueError, UnicodeDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    finally:
        result.latency = time.perf_counter() - t0
        conn.close()
    result.from_usage = usage_tokens is not None
    result.output_tokens = usage_tokens if result.from_usage else chunks
    result.ok = done or usage_tokens is not None
    if not result.ok:
        result.error = "the stream ended without [DONE]"
    return result


def run(endpoint: Endpoint, bodies: List[dict], concurrency: int,
        on_done: Callable[[int], None] = lambda n: None) -> Tuple[List[Result], float]:
    """Sends every body, `concurrency` at a time; returns the results in order and the wall time."""
    unsent: "queue.Queue[int]" = queue.Queue()   # indexes of the bodies no worker has taken yet
    for i in range(len(bodies)):
        unsent.put(i)
    results: List[Optional[Result]] = [None] * len(bodies)
    lock = threading.Lock()
    finished = 0

    def worker():
        nonlocal finished
        while True:
            try:
                i = unsent.get_nowait()
            except queue.Empty:
                return
            results[i] = run_one(endpoint, bodies[i])
            with lock:
                finished += 1
                on_done(finished)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(bodies)))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():   # a timed join: Ctrl-C reaches the main thread
            t.join(0.2)
    return results, time.perf_counter() - t0


def percentile(values: List[float], p: float) -> Optional[float]:
    """The p-th percentile (0-100), interpolating between the closest ranks; None for no values."""
    if not values:
        return None
    s = sorted(values)
    x = (len(s) - 1) * p / 100
    lo = int(x)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (x - lo)


def summarize(results: List[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok) if ok and all(r.prompt_tokens is not None for r in ok) else None
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itl]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft is not None and r.output_tokens > 1]

    def ms(v):
        return None if v is None else v * 1e3
    return {
        "requests_ok": len(ok), "requests_failed": len(results) - len(ok),
        # Counted chunks may each carry several tokens: only the usage says a request came short.
        "requests_short": sum(r.from_usage and r.output_tokens < r.asked for r in ok),
        "duration_s": duration, "prompt_tokens": prompt, "output_tokens": output,
        "output_tokens_per_s": output / duration if duration > 0 else None,
        "total_tokens_per_s": (prompt + output) / duration if prompt is not None and duration > 0 else None,
        "requests_per_s": len(ok) / duration if duration > 0 else None,
        "ttft_ms_p50": ms(percentile(ttft, 50)), "ttft_ms_p99": ms(percentile(ttft, 99)),
        "itl_ms_p50": ms(percentile(itl, 50)), "itl_ms_p99": ms(percentile(itl, 99)),
        "tpot_ms_p50": ms(percentile(tpot, 50)), "tpot_ms_p99": ms(percentile(tpot, 99)),
    }


_ROWS = (("requests ok", "requests_ok", "{}"), ("requests failed", "requests_failed", "{}"),
         ("duration (s)", "duration_s", "{:.2f}"), ("prompt tokens", "prompt_tokens", "{}"),
         ("output tokens", "output_tokens", "{}"), ("output tokens/s", "output_tokens_per_s", "{:.1f}"),
         ("total tokens/s", "total_tokens_per_s", "{:.1f}"), ("requests/s", "requests_per_s", "{:.2f}"),
         ("TTFT p50 (ms)", "ttft_ms_p50", "{:.1f}"), ("TTFT p99 (ms)", "ttft_ms_p99", "{:.1f}"),
         ("ITL p50 (ms)", "itl_ms_p50", "{:.1f}"), ("ITL p99 (ms)", "itl_ms_p99", "{:.1f}"),
         ("TPOT p50 (ms)", "tpot_ms_p50", "{:.1f}"), ("TPOT p99 (ms)", "tpot_ms_p99", "{:.1f}"))


def table(summary: dict) -> str:
    lines = ["| metric | value |", "|---|---|"]
    for label, key, fmt in _ROWS:
        value = summary[key]
        lines.append(f"| {label} | {'n/a' if value is None else fmt.format(value)} |")
    return "\n".join(lines)


def int_range(text: str) -> Tuple[int, int]:
    """'LO-HI' or 'N' as (LO, HI), both >= 1."""
    lo, sep, hi = text.partition("-")
    try:
        pair = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI (whole numbers), got {text!r}") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return pair


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Benchmark an OpenAI-compatible server (ember-server, "
                                                       "llama-server, vLLM) with streamed /v1/completions requests.")
    p.add_argument("--serving", metavar="URL", required=True,
                   help="the server's base URL, e.g. http://127.0.0.1:8080 (or .../v1)")
    p.add_argument("-n", "--num-requests", type=positive, default=100, help="requests to send (default 100)")
    p.add_argument("-c", "--concurrency", type=positive, default=16, help="requests in flight at once (default 16)")
    p.add_argument("--prompt-words", type=int_range, default=(100, 400), metavar="LO-HI",
                   help="words per prompt, drawn uniformly (default 100-400)")
    p.add_argument("--output-tokens", type=int_range, default=(64, 256), metavar="LO-HI",
                   help="max_tokens per request, drawn uniformly; ignore_eos makes them all come (default 64-256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and lengths (default 0)")
    p.add_argument("--model", default=None,
                   help="the request's model field (default: the first of the server's GET /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as `Authorization: Bearer KEY`")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may stall (default 600)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the results and settings to FILE")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _bench(args)
    except KeyboardInterrupt:
        return 130
    except (ConnectionError, ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


def _bench(args) -> int:
    endpoint = Endpoint(args.serving, args.api_key, args.timeout)
    served = endpoint.served_model()   # also fails fast, in one line, where the server cannot be reached
    model = args.model or served
    requests = make_requests(args.num_requests, args.prompt_words, args.output_tokens, args.seed)
    bodies = []
    for req in requests:
        body = {"prompt": req.prompt, "max_tokens": req.max_tokens, "ignore_eos": True, "temperature": args.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if model is not None:
            body["model"] = model
        bodies.append(body)
    print(f"{PROG}: {len(bodies)} requests, {args.concurrency} at a time, to {endpoint.url} (model {model or '-'})",
          file=sys.stderr)
    step = max(1, len(bodies) // 10)

    def progress(done: int) -> None:
        if done % step == 0 or done == len(bodies):
            print(f"{PROG}: {done}/{len(bodies)} done", file=sys.stderr, flush=True)

    results, duration = run(endpoint, bodies, args.concurrency, progress)
    summary = summarize(results, duration)
    print(table(summary))
    if args.json:
        settings = {"url": endpoint.url, "model": model, "num_requests": args.num_requests,
                    "concurrency": args.concurrency, "prompt_words": list(args.prompt_words),
                    "output_tokens": list(args.output_tokens), "seed": args.seed, "temperature": args.temperature}
        errors = [r.error for r in results if not r.ok]
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "summary": summary, "errors": errors}, f, indent=2)
            f.write("\n")
    failed = [r for r in results if not r.ok]
    if summary["requests_short"]:
        print(f"{PROG}: warning: {summary['requests_short']} requests got fewer tokens than max_tokens "
              f"(does the server honour ignore_eos?)", file=sys.stderr)
    if failed:
        print(f"{PROG}: error: {len(failed)} of {len(results)} requests failed; the first: {failed[0].error}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
