"""CPU mixture-of-experts op: the grouped moe (src/cpu/cpu_moe_grouped.cpp) against the contract's
default composition (src/backend/moe_default.cpp) on the same backend, in ms per call and the
rate at which the chosen experts' weights are read, per n_tok.

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python:tests python tools/bench_cpu_moe.py [--threads 2]

The default shape is Qwen3-30B-A3B's layer (2048 wide, 128 experts of 768, 8 chosen). Each figure is
the best of --reps runs (the machine may be shared). Times are per call of the test binding, which
copies x in and the output out."""
import argparse
import time

import gguf
import numpy as np

from conftest import kernel_module
from test_backend_ops import random_weight


def best_ms(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--n-embd", type=int, default=2048)
    ap.add_argument("--n-ff", type=int, default=768)
    ap.add_argument("--n-expert", type=int, default=128)
    ap.add_argument("--n-used", type=int, default=8)
    ap.add_argument("--n-tok", default="1,4,16,64")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    K = kernel_module()
    cpu = K.Backend("cpu", args.threads)
    rng = np.random.default_rng(0)
    t = gguf.GGMLQuantizationType[args.type]
    e, d, f = args.n_expert, args.n_embd, args.n_ff
    gate, up = (random_weight(t, e * f, d, rng, rms=1 / np.sqrt(d)) for _ in range(2))
    down = random_weight(t, e * d, f, rng, rms=1 / np.sqrt(f))
    router = (rng.standard_normal((e, d)) / np.sqrt(d)).astype(np.float32)
    expert_bytes = (gate.nbytes + up.nbytes + down.nbytes) / e
    print(f"{args.type} {d}x{f}, {e} experts, {args.n_used} chosen, {args.threads} threads")
    print(f"{'n_tok':>5} {'experts':>7} {'grouped ms':>10} {'GB/s':>6} {'composed ms':>11} {'speedup':>7}")
    for n_tok in (int(n) for n in args.n_tok.split(",")):
        x = rng.standard_normal((n_tok, d)).astype(np.float32)
        logits = x @ router.T
        used = len(set(np.argsort(-logits, axis=1)[:, :args.n_used].flat))
        run = lambda composed: cpu.moe(int(t), gate, up, down, router, x, args.n_used, gating="softmax",
                                       norm_topk=True, n_seq=n_tok, composed=composed)
        grouped, composed = best_ms(lambda: run(False), args.reps), best_ms(lambda: run(True), args.reps)
        print(f"{n_tok:5} {used:7} {grouped:10.2f} {used * expert_bytes / grouped / 1e6:6.1f} {composed:11.2f} "
              f"{composed / grouped:7.2f}")


if __name__ == "__main__":
    main()
