"""CPU batched quantized matmul: one sequence's path vs several sequences' (the fast kernels,
src/cpu/gemm_fast*.cpp), in ms and GFLOP/s per n_tok. One sequence takes the exact tiles
(bit-identical to vec_dot), or the fast kernels too where the type has a single-token one (Q4_0,
Q4_1, Q8_0 under AVX-512: then both columns run the same kernels).

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python:tests python tools/bench_cpu_gemm.py [--threads 2]

Shapes default to SmolLM2-135M's matrices (n_in x n_out). Each figure is the best of --reps
runs (the machine may be shared: the best run is the least disturbed one). Times are per call of
the test binding, which copies x in and y out: the small shapes carry that overhead too."""
import argparse
import os
import sys
import time

import gguf
import numpy as np

from conftest import kernel_module

SHAPES = {"q/o 576x576": (576, 576), "k/v 576x192": (576, 192), "gate/up 576x1536": (576, 1536),
          "down 1536x576": (1536, 576), "head 576x49152": (576, 49152),
          # llama2-7b's (K-quant rows need whole 256-element super-blocks)
          "7b q/o 4096x4096": (4096, 4096), "7b down 11008x4096": (11008, 4096)}


def best_ms(fn, iters, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t) / iters)
    return best * 1e3


def main():
    # The binding allocates each call's output afresh: glibc would map (and the kernel zero) a
    # large one every time unless freed memory is kept for reuse.
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 30), MALLOC_TRIM_THRESHOLD_=str(1 << 31))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="Q4_1,Q8_0")
    ap.add_argument("--n-tok", default="1,2,4,8,16,32,64")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="names from: " + ", ".join(SHAPES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-ms", type=float, default=20.0, help="time per run to aim for")
    args = ap.parse_args()
    K = kernel_module()
    cpu = K.Backend("cpu", args.threads)
    rng = np.random.default_rng(0)
    print(f"{'type':5} {'shape':17} {'n_tok':>5} {'exact ms':>9} {'GFLOP/s':>8} {'fast ms':>9} {'GFLOP/s':>8} "
          f"{'speedup':>7} {'fast/1tok':>9}")
    for name in args.types.split(","):
        qt = int(gguf.GGMLQuantizationType[name])
        for shape in args.shapes.split(","):
            n_in, n_out = SHAPES[shape]
            wq = K.quantize(qt, rng.standard_normal(n_out * n_in).astype(np.float32)).reshape(n_out, -1)
            one = None
            for n_tok in map(int, args.n_tok.split(",")):
                x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
                flop = 2.0 * n_in * n_out * n_tok
                probe = best_ms(lambda: cpu.matmul(qt, wq, n_in, x), 1, 1)
                iters = max(1, int(args.min_ms / max(probe, 1e-3)))
                exact = best_ms(lambda: cpu.matmul(qt, wq, n_in, x), iters, args.reps)
                line = f"{name:5} {shape:17} {n_tok:5d} {exact:9.3f} {flop / exact / 1e6:8.1f}"
                if n_tok == 1:   # (one token: the same path for one sequence or several)
                    one = exact
                    print(line, flush=True)
                    continue
                fast = best_ms(lambda: cpu.matmul(qt, wq, n_in, x, n_seq=2), iters, args.reps)
                ratio = f"{fast / one:9.2f}" if one else ""
                print(f"{line} {fast:9.3f} {flop / fast / 1e6:8.1f} {exact / fast:7.2f} {ratio}", flush=True)


if __name__ == "__main__":
    main()
