"""ember-bench: prompt-processing and generation speed, printed as a markdown table like llama-bench.

pp<P>: one forward over P prompt tokens. tg<N>: N tokens generated one at a time (after a prompt of
depth D with -d). For generation the table adds the effective weight bandwidth (bytes of weights and KV
read per token x tokens/s) and its share of the memory-bandwidth roofline. -ctk/-ctv pick the KV cache type
(options.KV_CACHE_TYPES; K and V alike); as in llama-bench, type_k/type_v columns appear when it is not f16.
-npl and --prefix-cache run the engine modes instead (bench_batched.py: many sequences at once);
--serving URL benchmarks an OpenAI-compatible server instead (bench_serving.py).
"""
import argparse
import statistics
import sys
import time

import numpy as np

from . import _ember, bench_batched, options
from .cli import run_tool
from .version import add_version

# Measured copy bandwidth of the H100 the anchors ran on (see docs/performance.md).
GPU_BANDWIDTH_GBS = 3000.0
# Bytes per cached K or V value (q8_0: 32 int8 values and one f16 scale, src/kv/kv_layout.h).
KV_BYTES_PER_VALUE = {"f16": 2.0, "bf16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                      "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}


def host_bandwidth_gbs() -> float:
    """Host memory bandwidth: best of a few 256 MiB copies, counting bytes read plus written."""
    src = np.ones(1 << 25, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9


def decode_bytes_per_token(model, kv_type: str, depth: int) -> float:
    """Weight bytes one decode step reads (every matrix once; only one embedding row; of a mixture's
    stacked experts only the expert_used_count a token takes) plus the KV."""
    f = _ember.GGUFFile(model.path)
    tensors = f.tensors()   # every shard's, for a split model
    arch = f.get_string("general.architecture")
    used_key = f"{arch}.expert_used_count"
    n_used = f.get_uint(used_key) if used_key in f.metadata() else 0
    total = 0
    tied = not any(t["name"] == "output.weight" for t in tensors)
    for t in tensors:
        if t["name"] == "token_embd.weight" and not tied:
            continue
        if n_used and len(t["ne"]) == 3:
            total += int(t["nbytes"]) * n_used // int(t["ne"][2])
            continue
        total += int(t["nbytes"])
    kv = 2 * model.n_layer * model.n_head_kv * model.head_dim * KV_BYTES_PER_VALUE[kv_type] * depth
    return float(total + kv)


def run_test(ctx, rng, n_vocab, n_prompt, n_gen, depth):
    ctx.truncate(0)
    if depth:
        ctx.eval(rng.integers(0, n_vocab, depth).tolist())
    if n_prompt:
        tokens = rng.integers(0, n_vocab, n_prompt).tolist()
        t = time.perf_counter()
        ctx.eval(tokens)
        return n_prompt / (time.perf_counter() - t)
    # As llama-bench: each step decodes a random token (its logits still come back to the host);
    # no sampling in the timed loop.
    tokens = [[int(t)] for t in rng.integers(0, n_vocab, n_gen)]
    t = time.perf_counter()
    for token in tokens:
        ctx.eval(token)
    return n_gen / (time.perf_counter() - t)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--serving" or a.startswith("--serving=") for a in argv):
        from . import bench_serving   # a server's benchmark: no model of its own (bench_serving.py)
        return bench_serving.main(argv)
    args = parser().parse_args(argv)
    return run_tool("ember-bench", lambda: _bench(args))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-bench", description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-d", "--depth", type=int, default=0, help="tokens already in the cache before each test")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=0.0, help="roofline GB/s (default: measured host / H100)")
    options.add_arguments(ap, options.BENCH)
    add_version(ap)
    bench_batched.add_args(ap)
    return ap


def _bench(args) -> int:
    kv_type = options.kv_cache_type(args.type_k, args.type_v)
    model = _ember.Model(args.model, options.fill(_ember.ModelParams(), vars(args)))
    if args.npl:
        return bench_batched.batched(model, args)
    if args.prefix_cache:
        return bench_batched.prefix_cache(model, args)
    n_ctx = args.depth + max(args.n_prompt, args.n_gen) + 1
    ctx = _ember.Context(model, options.fill(_ember.ContextParams(), vars(args), n_ctx=n_ctx))
    on_gpu = model.n_gpu_layers != 0   # 0 where a build without CUDA runs everything on the CPU
    bandwidth = args.bandwidth or (GPU_BANDWIDTH_GBS if on_gpu else host_bandwidth_gbs())
    rng = np.random.default_rng(1234)
    backend = "CUDA" if on_gpu else "CPU"
    kv_names = ("" if kv_type == "f16" else " type_k | type_v |") + ("" if args.offload_kqv else " nkvo |")
    kv_cells = ("" if kv_type == "f16" else f" {kv_type} | {kv_type} |") + ("" if args.offload_kqv else " 1 |")
    # As llama-bench: a placement option's column appears where it is set.
    placed = [(name, value) for name, value in (("n_cpu_moe", args.n_cpu_moe), ("cpu_moe", int(args.cpu_moe)),
                                                ("ot", ";".join(args.override_tensor or [])),
                                                ("moe_gpu_budget", args.moe_gpu_budget_mb)) if value]
    kv_names += "".join(f" {name} |" for name, _ in placed)
    kv_cells += "".join(f" {value} |" for _, value in placed)
    header = (f"| model | size | params | backend | ngl | threads |{kv_names} test | t/s | GB/s "
              f"| % roofline ({bandwidth:.0f} GB/s) |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    tests = []
    if args.n_prompt > 0:
        tests.append((f"pp{args.n_prompt}", args.n_prompt, 0))
    if args.n_gen > 0:
        tests.append((f"tg{args.n_gen}", 0, args.n_gen))
    for name, n_prompt, n_gen in tests:
        if args.depth:
            name += f" @ d{args.depth}"
        # Warm-up: one run of the test itself, so buffers, cuBLAS plans and the decode-step graphs
        # of every context length bucket exist before timing (a server pays these once).
        run_test(ctx, rng, model.n_vocab, n_prompt, n_gen, args.depth)
        speeds = [run_test(ctx, rng, model.n_vocab, n_prompt, n_gen, args.depth) for _ in range(args.repetitions)]
        mean = statistics.mean(speeds)
        std = statistics.stdev(speeds) if len(speeds) > 1 else 0.0
        gbs = roof = ""
        if n_gen:
            rate = decode_bytes_per_token(model, kv_type, args.depth + n_gen // 2) * mean / 1e9
            gbs, roof = f"{rate:.1f}", f"{100 * rate / bandwidth:.1f}%"
        print(f"| {model.path.rsplit('/', 1)[-1]} | {model.size_bytes / 2**30:.2f} GiB | {model.n_params / 1e9:.2f} B "
              f"| {backend} | {model.n_gpu_layers} | {args.n_threads or 'all'} |{kv_cells} {name} "
              f"| {mean:.2f} ± {std:.2f} "
              f"| {gbs} | {roof} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
