#!/usr/bin/env python3
"""Decode speed of every repetition (not only their mean), after a warm-up at the same depth:
shows whether run-to-run spread comes from one slow repetition or from all of them.

    bench_reps.py MODEL.gguf DEPTH [N_GEN [REPS [KV_TYPE]]]
"""
import sys

import numpy as np

from ember import _ember
from ember.bench import run_test


def main():
    path, depth = sys.argv[1], int(sys.argv[2])
    n_gen = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    kv_type = sys.argv[5] if len(sys.argv) > 5 else "f16"
    model = _ember.Model(path, n_gpu_layers=-1)
    ctx = _ember.Context(model, n_ctx=depth + n_gen + 1, n_batch=512, kv_type=kv_type)
    rng = np.random.default_rng(1234)
    run_test(ctx, rng, model.n_vocab, 0, n_gen, depth)   # warm-up: graphs of this depth's buckets
    speeds = [run_test(ctx, rng, model.n_vocab, 0, n_gen, depth) for _ in range(reps)]
    print(f"tg{n_gen} @ d{depth} ({kv_type}) per repetition: " + " ".join(f"{s:.1f}" for s in speeds), flush=True)


if __name__ == "__main__":
    main()
