#!/usr/bin/env python3
"""CPU decode matmul bandwidth by thread count: Q4_0 4096x11008 (llama2-7b down projection),
one token, eight weight copies in rotation so the 200 MB never sit in the last-level cache."""
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from ember import _ember as E
from test_cuda import random_weight


def main():
    rng = np.random.default_rng(0)
    ws = [random_weight(T.Q4_0, 4096, 11008, rng) for _ in range(8)]
    x = rng.standard_normal((1, 11008)).astype(np.float32)
    for n in (1, 2, 4, 8, 12, 16):
        be = E.Backend("cpu", n)
        for w in ws:
            be.matmul(int(T.Q4_0), w, 11008, x)
        t = time.perf_counter()
        for i in range(48):
            be.matmul(int(T.Q4_0), ws[i % 8], 11008, x)
        dt = (time.perf_counter() - t) / 48
        print(f"{n:2d} threads: {dt * 1e3:.2f} ms per matmul, {ws[0].nbytes / dt / 1e9:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
