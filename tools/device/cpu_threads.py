#!/usr/bin/env python3
"""CPU decode matmul bandwidth by thread count: Q4_0 4096x11008 (llama2-7b down projection),
one token. COPIES weight copies in rotation (default 8: 200 MB, more than a share of the
last-level cache) or 1 (25 MB, cache-resident: the kernel's compute rate).

    cpu_threads.py [COPIES [THREADS...]]
"""
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from ember import _ember as E
from test_cuda import random_weight


def main():
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    threads = [int(a) for a in sys.argv[2:]] or [1, 2, 4, 8, 12, 16]
    rng = np.random.default_rng(0)
    ws = [random_weight(T.Q4_0, 4096, 11008, rng) for _ in range(copies)]
    x = rng.standard_normal((1, 11008)).astype(np.float32)
    for n in threads:
        be = E.Backend("cpu", n)
        for w in ws:
            be.matmul(int(T.Q4_0), w, 11008, x)
        t = time.perf_counter()
        for i in range(48):
            be.matmul(int(T.Q4_0), ws[i % copies], 11008, x)
        dt = (time.perf_counter() - t) / 48
        print(f"{copies} copies, {n:2d} threads: {dt * 1e3:.2f} ms per matmul, {ws[0].nbytes / dt / 1e9:.1f} GB/s",
              flush=True)


if __name__ == "__main__":
    main()
