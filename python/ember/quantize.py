"""ember-quantize: quantize a GGUF model (C++, multi-threaded, streaming tensor by tensor).

    ember-quantize IN.gguf OUT.gguf TYPE [-t N] [--allow-requantize]
"""
import argparse
import sys

from . import _ember, options
from .cli import run_tool

TYPES = "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K Q4_K_M Q5_K_M MXFP4_MOE F16 BF16 F32"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-quantize", description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("type", help=TYPES)
    ap.add_argument("--allow-requantize", action="store_true", help="allow an already-quantized input")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-tensor progress on stderr")
    options.add_arguments(ap, options.QUANTIZE)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)

    def progress(i, n, name, type_name):
        if not args.quiet:
            print(f"[{i + 1:4d}/{n}] {name:40s} -> {type_name}", file=sys.stderr, flush=True)

    def run():
        _ember.quantize_model(args.input, args.output, args.type, args.n_threads or 0, args.allow_requantize,
                              progress)
        return 0

    return run_tool("ember-quantize", run)


if __name__ == "__main__":
    sys.exit(main())
