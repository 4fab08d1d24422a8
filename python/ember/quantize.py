"""ember-quantize: quantize a GGUF model (C++, multi-threaded, streaming tensor by tensor).

    ember-quantize IN.gguf OUT.gguf TYPE [-t N] [--allow-requantize]

Each tensor's chosen type is printed as it is written, then a summary: the tensors of each type,
their sizes, and the input and output file sizes.
"""
import argparse
import collections
import os
import sys

from . import _ember, options
from .cli import run_tool
from .version import add_version

TYPES = "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K Q4_K_M Q5_K_M MXFP4_MOE F16 BF16 F32"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-quantize", description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("type", help=TYPES)
    ap.add_argument("--allow-requantize", action="store_true", help="allow an already-quantized input")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-tensor progress on stderr")
    options.add_arguments(ap, options.QUANTIZE)
    add_version(ap)
    return ap


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def summary(input_path: str, output_path: str) -> str:
    """Per output type: how many tensors, their bytes before and after; the files' sizes, and a
    warning where the output is not smaller than the input."""
    before = {t["name"]: t for t in _ember.GGUFFile(input_path).tensors()}
    by_type = collections.defaultdict(lambda: [0, 0, 0, collections.Counter()])
    for t in _ember.GGUFFile(output_path).tensors():
        row = by_type[_ember.type_info(t["type"])["name"]]
        src = before.get(t["name"])
        row[0] += 1
        row[1] += src["nbytes"] if src else 0
        row[2] += t["nbytes"]
        if src:
            row[3][_ember.type_info(src["type"])["name"]] += 1
    lines = ["type     tensors  from                       input        output"]
    for name, (count, size_in, size_out, sources) in sorted(by_type.items(), key=lambda kv: -kv[1][2]):
        origin = ", ".join(f"{k} x{v}" for k, v in sources.most_common())
        lines.append(f"{name:8s} {count:7d}  {origin[:26]:26s} {_mib(size_in):>12s} {_mib(size_out):>12s}")
    size_in, size_out = os.path.getsize(input_path), os.path.getsize(output_path)
    lines.append(f"file: {_mib(size_in)} -> {_mib(size_out)} ({size_out / size_in:.0%} of the input)")
    if size_out >= size_in:
        lines.append("warning: the output is not smaller than the input (tensors whose rows do not fit the type's "
                     "blocks fall back to a larger type; see the table)")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parser().parse_args(argv)

    def progress(i, n, name, type_name):
        if not args.quiet:
            print(f"[{i + 1:4d}/{n}] {name:40s} -> {type_name}", file=sys.stderr, flush=True)

    def run():
        _ember.quantize_model(args.input, args.output, args.type, args.n_threads or 0, args.allow_requantize,
                              progress)
        print(summary(args.input, args.output), file=sys.stderr)
        return 0

    return run_tool("ember-quantize", run)


if __name__ == "__main__":
    sys.exit(main())
