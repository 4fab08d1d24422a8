"""ember-bench's engine modes: many sequences at once through the continuous-batching engine.

Batched (-npl): for each B, B requests of -npp random prompt tokens each generate -ntg tokens
(end-of-generation ignored), as llama-batched-bench measures: PP is the time until every request
has its first token (all prompts in one step when -ub allows), TG the decode steps after it, and
S_TG = B * (ntg - 1) / T_TG the aggregate decode tokens/s (the first token comes from the prompt
step). Prefix cache (--prefix-cache P): two requests share a P-token prefix; the second's time to
first token against the first's.
"""
import time

import numpy as np

from . import _ember, options


def _engine(model, args, n_ctx, max_num_seqs, batched_tokens):
    """An engine whose KV pool holds max_num_seqs full sequences (no preemption in the timing)."""
    params = options.fill(_ember.EngineParams(), vars(args), n_ctx=n_ctx, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=batched_tokens)
    params.kv_blocks = max_num_seqs * -(-n_ctx // params.kv_block_size)
    return _ember.Engine(model, params)


def _drain(engine, ids, on_output=None):
    """Polls until every request in ids has finished; returns {id: n tokens}."""
    left, counts = set(ids), {i: 0 for i in ids}
    while left:
        for o in engine.poll(0.5):
            counts[o.request_id] += len(o.token_ids)
            if on_output:
                on_output(o)
            if o.finished:
                if o.finish_reason == "error":
                    raise RuntimeError(f"request {o.request_id} failed: {o.error}")
                left.discard(o.request_id)
    return counts


def run_batch(engine, rng, n_vocab, batch, npp, ntg):
    """One batched-bench row: (T_PP, T_TG) in seconds."""
    t0 = time.perf_counter()
    first_at = {}

    def seen(o):
        if o.token_ids and o.request_id not in first_at:
            first_at[o.request_id] = time.perf_counter()

    ids = [engine.add_request(rng.integers(0, n_vocab, npp).tolist(), temperature=0.0, max_tokens=ntg,
                              min_tokens=ntg, ignore_eos=True) for _ in range(batch)]
    counts = _drain(engine, ids, seen)
    t_end = time.perf_counter()
    if any(c != ntg for c in counts.values()):
        raise RuntimeError(f"expected {ntg} tokens per request, got {sorted(set(counts.values()))}")
    t_pp = max(first_at.values()) - t0
    return t_pp, t_end - t0 - t_pp


def batched(model, args) -> int:
    batches = [int(b) for b in str(args.npl).split(",")]
    n_ctx = args.npp + args.ntg + 1
    max_b = max(batches)
    budget = args.ubatch or max(512, max_b * args.npp)
    engine = _engine(model, args, n_ctx, max_b, budget)
    rng = np.random.default_rng(1234)
    print(f"engine: max_num_batched_tokens {budget}, n_ctx {n_ctx}, deterministic {args.deterministic}, "
          f"KV {args.type_k}/{args.type_v}")
    header = "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.strip("|").split("|")) + "|")
    for b in batches:
        run_batch(engine, rng, model.n_vocab, b, args.npp, min(args.ntg, 8))   # warm-up: buffers, graphs
        t_pp, t_tg = run_batch(engine, rng, model.n_vocab, b, args.npp, args.ntg)
        s_pp = b * args.npp / t_pp
        s_tg = b * (args.ntg - 1) / t_tg
        total = t_pp + t_tg
        print(f"| {args.npp:5d} | {args.ntg:6d} | {b:4d} | {b * (args.npp + args.ntg):6d} | {t_pp:8.3f} | "
              f"{s_pp:8.2f} | {t_tg:8.3f} | {s_tg:8.2f} | {total:8.3f} | {b * (args.npp + args.ntg) / total:8.2f} |",
              flush=True)
    engine.close()
    return 0


def prefix_cache(model, args) -> int:
    n_prefix = args.prefix_cache
    n_ctx = n_prefix + 64
    engine = _engine(model, args, n_ctx, 4, args.ubatch or 512)
    rng = np.random.default_rng(1234)
    prefix = rng.integers(0, model.n_vocab, n_prefix).tolist()
    ttft = []
    for _ in range(2):
        t0 = time.perf_counter()
        first = []

        def seen(o):
            if o.token_ids and not first:
                first.append(time.perf_counter())

        rid = engine.add_request(prefix + rng.integers(0, model.n_vocab, 8).tolist(), temperature=0.0, max_tokens=1)
        _drain(engine, [rid], seen)
        ttft.append(first[0] - t0)
    stats = engine.stats()
    engine.close()
    print(f"shared prefix {n_prefix} tokens: TTFT first {ttft[0] * 1e3:.1f} ms, second {ttft[1] * 1e3:.1f} ms "
          f"({100 * ttft[1] / ttft[0]:.1f}% of the first); prompt tokens from the cache: "
          f"{stats['cached_prompt_tokens']}")
    return 0


def add_args(ap) -> None:
    g = ap.add_argument_group("engine modes (continuous batching)")
    g.add_argument("-npl", default="", help="batched mode: comma-separated numbers of parallel sequences")
    g.add_argument("-npp", type=int, default=128, help="batched mode: prompt tokens per sequence")
    g.add_argument("-ntg", type=int, default=128, help="batched mode: generated tokens per sequence")
    g.add_argument("-ub", "--ubatch", type=int, default=0,
                   help="engine step token budget (default: every prompt of a batch in one step)")
    g.add_argument("--prefix-cache", type=int, default=0, metavar="P",
                   help="time to first token of a request sharing a P-token prefix with the one before")
