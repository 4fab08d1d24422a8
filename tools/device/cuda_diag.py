#!/usr/bin/env python3
"""GPU-vs-CPU logits of a short prompt and 60 decode steps, per CUDA backend configuration
(default, EMBER_CUDA_GRAPHS=0, EMBER_CUDA_FUSE=0, both off, half the blocks on the CPU): tells
which part of the decode path a divergence comes from. Every run sees the same tokens (the
CPU's greedy choices).

    cuda_diag.py MODEL.gguf [PROMPT_LEN]
"""
import os
import sys
import time

import numpy as np

from ember import _ember as E


def run(path, ngl, prompt, steps):
    ctx = E.Context(E.Model(path, n_gpu_layers=ngl), n_ctx=256, n_batch=64, n_threads=8)
    ctx.eval(prompt)
    rows = [np.array(ctx.logits(-1), np.float64)]
    start = time.perf_counter()
    for t in steps:
        ctx.eval([t])
        rows.append(np.array(ctx.logits(-1), np.float64))
    run.ms_per_step = (time.perf_counter() - start) / len(steps) * 1e3
    return np.stack(rows)


def main():
    path = sys.argv[1]
    n_prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    n_vocab = E.Model(path).n_vocab
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, n_vocab, n_prompt)]
    # The CPU's own greedy continuation gives the token sequence every run replays.
    ctx = E.Context(E.Model(path), n_ctx=256, n_batch=64, n_threads=8)
    ctx.eval(prompt)
    steps = []
    for _ in range(60):
        steps.append(int(np.argmax(ctx.logits(-1))))
        ctx.eval([steps[-1]])
    ref = run(path, 0, prompt, steps)
    half = E.Model(path).n_layer // 2
    for name, ngl, env in (("default", -1, {}), ("graphs=0", -1, {"EMBER_CUDA_GRAPHS": "0"}),
                           ("fuse=0", -1, {"EMBER_CUDA_FUSE": "0"}),
                           ("both=0", -1, {"EMBER_CUDA_GRAPHS": "0", "EMBER_CUDA_FUSE": "0"}),
                           ("pdl=0", -1, {"EMBER_CUDA_PDL": "0"}), ("exact=0", -1, {"EMBER_CUDA_EXACT_ATTN": "0"}),
                           ("split", half, {}), ("split g=0", half, {"EMBER_CUDA_GRAPHS": "0"})):
        for k in ("EMBER_CUDA_GRAPHS", "EMBER_CUDA_FUSE", "EMBER_CUDA_PDL", "EMBER_CUDA_EXACT_ATTN"):
            os.environ.pop(k, None)
        os.environ.update(env)
        got = run(path, ngl, prompt, steps)
        err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
        same = (got.argmax(1) == ref.argmax(1)).mean()
        print(f"{name:9s} prompt {err[0]:.2e}  steps max {err[1:].max():.2e} mean {err[1:].mean():.2e}  "
              f"argmax agree {same:.2f}  {run.ms_per_step:.2f} ms/step")


if __name__ == "__main__":
    main()
