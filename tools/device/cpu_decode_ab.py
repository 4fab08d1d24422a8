#!/usr/bin/env python3
"""A/B of CPU backend settings read from the environment when a context is made (e.g.
EMBER_CPU_HANDOUT_KB), or of the thread count (VAR "threads"), on one model: one context per
setting, decode steps interleaved between them in rounds so that machine drift hits every
setting alike. Prints tokens/s per setting (median and spread over rounds).

    cpu_decode_ab.py MODEL NGL THREADS VAR VALUE [VALUE...]     (AB_ROUNDS: rounds, default 12)
"""
import os
import statistics
import sys
import time

from ember import _ember as E

STEPS, ROUNDS = 8, int(os.environ.get("AB_ROUNDS", "12"))


def main():
    path, ngl, threads, var, values = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    model = E.Model(path, n_gpu_layers=ngl)
    ctxs = []
    for v in values:
        if var != "threads":
            os.environ[var] = v
        n = int(v) if var == "threads" else threads
        ctxs.append(E.Context(model, n_ctx=STEPS * ROUNDS + 8, n_batch=8, n_threads=n))
    if len(set(values)) != len(values):
        sys.exit("cpu_decode_ab.py: each VALUE once")
    rates = {v: [] for v in values}
    for r in range(ROUNDS + 1):
        for v, ctx in zip(values, ctxs):
            t = time.perf_counter()
            for i in range(STEPS):
                ctx.eval([1 + (r * STEPS + i) % 500])
            if r:   # round 0 warms up
                rates[v].append(STEPS / (time.perf_counter() - t))
    for v in values:
        q = sorted(rates[v])
        print(f"{var}={v}: {statistics.median(q):.2f} tok/s (min {q[0]:.2f}, max {q[-1]:.2f})", flush=True)


if __name__ == "__main__":
    main()
