"""The engine's host tier at work: a workload whose KV is about 3x the pool, many requests
sharing a few long prefixes, run three ways with the same requests: an unconstrained pool, the
small pool with recompute-only preemption, and the small pool with a host tier. Prints each
run's wall time, generated tokens/s and the engine's counters. The engine runs in deterministic
mode, so a request's tokens do not depend on what shares its steps and the runs must agree.

    python tools/bench_host_tier.py -m MODEL.gguf [-ngl -1] [-t 2] [--requests 24]

(On the CPU both pools are host memory, so the tier's copies are memcpy: the figure shows what
swapping saves over recomputing there; on a GPU the copies cross PCIe.)"""
import argparse
import time

import numpy as np

from ember import LLM, SamplingParams, _ember


def workload(n_vocab, n_requests, prefix_len, suffix_len, seed=0):
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(100, n_vocab, prefix_len).tolist() for _ in range(3)]
    return [prefixes[i % 3] + rng.integers(100, n_vocab, suffix_len).tolist() for i in range(n_requests)]


def run(model, prompts, args, **kw):
    with LLM(model, n_ctx=args.n_ctx, n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
             max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.batch, deterministic=True, **kw) as llm:
        params = SamplingParams(temperature=0, max_tokens=args.gen, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        return outs, wall, llm.stats()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prefix", type=int, default=96, help="tokens of each of the 3 shared prefixes")
    ap.add_argument("--suffix", type=int, default=16, help="tokens of each request's own part")
    ap.add_argument("--gen", type=int, default=48, help="tokens generated per request")
    ap.add_argument("--max-num-seqs", type=int, default=12)
    ap.add_argument("-b", "--batch", type=int, default=256)
    args = ap.parse_args()
    args.n_ctx = args.prefix + args.suffix + args.gen
    m = _ember.Model(args.model)
    # MiB of one f16 KV block of 16 tokens over every layer (K and V).
    args.block_mib = m.n_layer * 2 * 16 * m.n_head_kv * m.head_dim * 2 / 2**20
    prompts = workload(m.n_vocab, args.requests, args.prefix, args.suffix)
    del m
    seq_blocks = -(-args.n_ctx // 16)
    # The KV all requests would hold at once, in blocks, and a pool of a third of it.
    need = args.max_num_seqs * seq_blocks
    small = max(seq_blocks + 1, need // 3)
    print(f"{args.requests} requests, 3 shared prefixes of {args.prefix} tokens, {args.gen} generated each; "
          f"{args.max_num_seqs} at once need {need} KV blocks, the small pool has {small}")
    runs = [("unconstrained", dict(kv_blocks_arg=need)),
            ("small pool, recompute", dict(kv_blocks_arg=small)),
            ("small pool + host tier", dict(kv_blocks_arg=small, host=True))]
    base = None
    print("| run | wall s | gen tok/s | preemptions | swaps out/in | host hits | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, cfg in runs:
        kw = dict(kv_mb=cfg["kv_blocks_arg"] * args.block_mib)
        if cfg.get("host"):
            kw["kv_host_mb"] = 2 * need * args.block_mib
        outs, wall, s = run(args.model, prompts, args, **kw)
        tokens = [o.outputs[0].token_ids for o in outs]
        base = base or tokens
        n_gen = sum(len(t) for t in tokens)
        print(f"| {name} | {wall:.2f} | {n_gen / wall:.1f} | {s['preemptions']} | {s['swaps_out']}/{s['swaps_in']} "
              f"| {s['host_cache_hits']} | {tokens == base} |", flush=True)


if __name__ == "__main__":
    main()
