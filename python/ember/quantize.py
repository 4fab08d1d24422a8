"""ember-quantize: quantize a GGUF model (C++, multi-threaded, streaming tensor by tensor).

    ember-quantize IN.gguf OUT.gguf TYPE [-t N] [--allow-requantize] [--split-max-size N(M|G) | --split-max-tensors N]
        [--tensor-type REGEX=TYPE ...] [--output-tensor-type TYPE] [--token-embedding-type TYPE] [--imatrix FILE]

--tensor-type gives the weight matrices whose names REGEX matches (searched, as llama-quantize
does; the first matching option wins) TYPE instead of the recipe's; --output-tensor-type and
--token-embedding-type set the output head's and the token embedding's. A K type on rows that are not
a multiple of 256 falls back as in the recipe (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ types -> IQ4_NL).

--imatrix reads an importance matrix (ember-imatrix's or llama-imatrix's, GGUF or .dat): the Q2_K, Q3_K,
Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL, IQ3_XXS, IQ3_S and IQ2 tensors it has an entry for are quantized minimising
the error weighted by each column's importance, as llama-quantize does (byte for byte); a stacked expert
tensor's experts each with their own row of importances. IQ3_XXS and the IQ2 types are refused without an
entry for the tensor (but on the token embedding and the output head), as llama-quantize refuses them.

Each tensor's chosen type is printed as it is written, then a summary: the tensors of each type,
their sizes, and the input and output file sizes. With a split limit the output is shards as
llama-gguf-split writes them: OUT-00001-of-0000N.gguf, ... (OUT without its .gguf).
"""
import argparse
import collections
import os
import sys

from . import _ember, gguf_split, options
from .cli import run_tool
from .version import add_version

TYPES = ("Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K Q5_K Q6_K Q4_K_M Q5_K_M IQ4_XS IQ3_S IQ3_M IQ3_XXS "
         "IQ2_XXS IQ2_XS IQ2_S IQ2_M MXFP4_MOE F16 BF16 F32")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-quantize", description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("type", help=TYPES)
    ap.add_argument("--allow-requantize", action="store_true", help="allow an already-quantized input")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-tensor progress on stderr")
    split = ap.add_mutually_exclusive_group()
    split.add_argument("--split-max-size", type=gguf_split.parse_size, metavar="N(M|G)",
                       help="write shards of at most this many tensor bytes (M = 1000^2, G = 1000^3 bytes)")
    split.add_argument("--split-max-tensors", type=int, metavar="N", help="write shards of at most N tensors")
    ap.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                    help="type of the weight matrices whose names match REGEX (repeatable; the first match wins)")
    ap.add_argument("--output-tensor-type", default="", metavar="TYPE", help="type of output.weight")
    ap.add_argument("--token-embedding-type", default="", metavar="TYPE", help="type of token_embd.weight")
    ap.add_argument("--imatrix", metavar="FILE", help="importance matrix (GGUF or .dat) weighting the error")
    options.add_arguments(ap, options.QUANTIZE)
    add_version(ap)
    return ap


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _model_size(path: str) -> int:
    return sum(os.path.getsize(p) for p in _ember.GGUFFile(path).split_paths)


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
    size_in, size_out = _model_size(input_path), _model_size(output_path)
    lines.append(f"file: {_mib(size_in)} -> {_mib(size_out)} ({size_out / size_in:.0%} of the input)")
    if size_out >= size_in:
        lines.append("warning: the output is not smaller than the input (tensors whose rows do not fit the type's "
                     "blocks fall back to a larger type; see the table)")
    return "\n".join(lines)


def _read_imatrix(path: str):
    from . import imatrix

    m = imatrix.read(path)
    print(f"imatrix: {len(m.entries)} entries from {path}, {m.chunk_count} chunks", file=sys.stderr)
    return m


def _weights(m) -> dict:
    return {name: e.importance().reshape(-1).tolist() for name, e in m.entries.items()}


def imatrix_weights(path: str) -> dict:
    """Per weight name, its columns' importances from an imatrix file (an expert tensor's: each expert's in turn)."""
    return _weights(_read_imatrix(path))


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.split_max_tensors is not None and args.split_max_tensors < 1:
        ap.error(f"--split-max-tensors must be at least 1 (got {args.split_max_tensors})")

    def progress(i, n, name, type_name):
        if not args.quiet:
            print(f"[{i + 1:4d}/{n}] {name:40s} -> {type_name}", file=sys.stderr, flush=True)

    def run():
        m = _read_imatrix(args.imatrix) if args.imatrix else None
        # the file, its first dataset and chunk count are recorded in the output's quantize.imatrix.* keys
        source = {"imatrix_file": args.imatrix, "imatrix_dataset": m.datasets[0] if m.datasets else "",
                  "imatrix_chunks": max(0, m.chunk_count)} if m else {}
        paths = _ember.quantize_model(args.input, args.output, args.type, args.n_threads or 0,
                                      args.allow_requantize, progress, args.split_max_size or 0,
                                      args.split_max_tensors or 0, args.tensor_type, args.output_tensor_type,
                                      args.token_embedding_type, _weights(m) if m else {}, **source)
        if len(paths) > 1:
            print(f"wrote {len(paths)} shards: " + ", ".join(paths), file=sys.stderr)
        print(summary(args.input, paths[0]), file=sys.stderr)
        return 0

    return run_tool("ember-quantize", run)


if __name__ == "__main__":
    sys.exit(main())
