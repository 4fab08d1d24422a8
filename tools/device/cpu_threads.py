#!/usr/bin/env python3
"""CPU decode matmul bandwidth by thread count: Q4_0 4096x11008 (llama2-7b down projection),
one token. COPIES weight copies in rotation (8: 200 MB, more than a share of the last-level
cache; 1: 25 MB, cache-resident: the kernel's compute rate). BACKING: "anon" (numpy arrays,
which numpy places in transparent huge pages) or "file" (a read-only np.memmap of the page
cache, 4 KiB pages, as a GGUF mapping is).

    cpu_threads.py [COPIES [BACKING [THREADS...]]]
"""
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGMLQuantizationType as T

from ember import _ember as E
from test_cuda import random_weight


def weights(copies, backing, rng):
    ws = [random_weight(T.Q4_0, 4096, 11008, rng) for _ in range(copies)]
    if backing == "anon":
        return ws
    path = os.path.join(tempfile.gettempdir(), "cpu_threads_weights.bin")
    np.concatenate(ws).tofile(path)
    m = np.memmap(path, dtype=np.uint8, mode="r").reshape(copies * ws[0].shape[0], ws[0].shape[1])
    return [m[i * ws[0].shape[0]:(i + 1) * ws[0].shape[0]] for i in range(copies)]


def read_rate(ws, n):
    """GB/s of n threads summing the weight bytes (numpy releases the GIL): the memory's own rate."""
    views = [w.view(np.uint64) for w in ws]
    with ThreadPoolExecutor(n) as ex:
        parts = [v[len(v) * i // n:len(v) * (i + 1) // n] for v in views for i in range(n)]
        list(ex.map(np.bitwise_xor.reduce, parts))
        t = time.perf_counter()
        list(ex.map(np.bitwise_xor.reduce, parts))
        return sum(v.nbytes for v in views) / (time.perf_counter() - t) / 1e9


def main():
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    backing = sys.argv[2] if len(sys.argv) > 2 else "anon"
    if backing not in ("anon", "file"):
        sys.exit(f"cpu_threads.py: BACKING is anon or file, got {backing!r}")
    threads = [int(a) for a in sys.argv[3:]] or [1, 2, 4, 8, 12, 16]
    ws = weights(copies, backing, np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((1, 11008)).astype(np.float32)
    for n in threads:
        be = E.Backend("cpu", n)
        for w in ws:
            be.matmul(int(T.Q4_0), w, 11008, x)
        t = time.perf_counter()
        for i in range(48):
            be.matmul(int(T.Q4_0), ws[i % copies], 11008, x)
        dt = (time.perf_counter() - t) / 48
        print(f"{copies} copies ({backing}), {n:2d} threads: {dt * 1e3:.2f} ms per matmul, "
              f"{ws[0].nbytes / dt / 1e9:.1f} GB/s; plain read {read_rate(ws, n):.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
