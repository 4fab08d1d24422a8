#!/usr/bin/env python3
"""Drive a few decode steps for Nsight Compute (ncu) to time every kernel of one step.

    ncu --metrics gpu__time_duration.sum --csv ... cuda_profile.py MODEL.gguf [STEPS [DEPTH [KV_TYPE]]]

Prints the wall time per step first (graphs as configured by EMBER_CUDA_GRAPHS), so the sum of
kernel times can be set against it: the difference is launch gaps and host work. The decode steps
run inside a profiler range (cuProfilerStart/Stop), so `ncu --profile-from-start off` skips the
prompt's kernels.
"""
import ctypes
import sys
import time

from ember import _ember as E


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    kv_type = sys.argv[4] if len(sys.argv) > 4 else "f16"
    ctx = E.Context(E.Model(path, n_gpu_layers=-1), n_ctx=depth + steps + 2, n_batch=512, type_k=kv_type,
                    type_v=kv_type)
    ctx.eval([1 + i % 1000 for i in range(depth)])
    ctx.eval([3])   # the first decode step sizes its scratch buffers
    driver = ctypes.CDLL("libcuda.so.1")
    tok = 5
    t = time.perf_counter()
    driver.cuProfilerStart()
    for _ in range(steps):
        ctx.eval([tok])
        tok = (tok * 7 + 3) % 1000
    driver.cuProfilerStop()
    print(f"ms per decode step: {(time.perf_counter() - t) / steps * 1e3:.3f}", flush=True)


if __name__ == "__main__":
    main()
