"""ember-gguf-split: split a GGUF model into shards, or merge shards into one file, as llama-gguf-split does.

    ember-gguf-split [--split] [--split-max-tensors N | --split-max-size N(M|G)] IN.gguf OUT_PREFIX
    ember-gguf-split --merge IN-00001-of-0000N.gguf OUT.gguf

Shards are named OUT_PREFIX-00001-of-0000N.gguf, ...; the first holds all the metadata, every shard the
split keys (split.no, split.count, split.tensors.count) and its tensors. Merging drops the split keys, so
merging the shards of a file ember wrote gives back that file byte for byte.
"""
# Written through ember's own GGUF reader and writer (the C++ classes behind _ember.GGUFFile/GGUFWriter):
# the reader already maps every shard of a split model, and the writer is the one ember-quantize uses.
import argparse
import os
import re
import sys

from . import _ember
from .cli import run_tool
from .version import add_version

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT = "split.no", "split.count", "split.tensors.count"
DEFAULT_MAX_TENSORS = 128   # llama-gguf-split's default


def parse_size(text: str) -> int:
    """'500M' or '2G' in bytes; like llama-gguf-split, M is 1000^2 and G 1000^3 bytes."""
    m = re.fullmatch(r"([0-9]+)([MG])", text.strip())
    if not m or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected a positive number then M or G, e.g. 500M")
    return int(m.group(1)) * (1000**2 if m.group(2) == "M" else 1000**3)


def split_path(prefix: str, split_no: int, n_split: int) -> str:
    """llama.cpp's shard name: PREFIX-00001-of-00003.gguf for split_no 0 of 3."""
    return f"{prefix}-{split_no + 1:05d}-of-{n_split:05d}.gguf"


def plan(nbytes: list, max_bytes: int = 0, max_tensors: int = 0, alignment: int = 32) -> list:
    """The shard of each tensor (the rule of src/gguf/split.cpp's gguf_split_plan): a shard ends after
    max_tensors tensors, or before a tensor that would take its padded tensor bytes past max_bytes."""
    shard_of, shard, size, count = [], 0, 0, 0
    for n in nbytes:
        padded = -(-n // alignment) * alignment
        if count and ((max_tensors and count >= max_tensors) or (max_bytes and size + padded > max_bytes)):
            shard, size, count = shard + 1, 0, 0
        size, count = size + padded, count + 1
        shard_of.append(shard)
    return shard_of


def _leaf_type(type_string: str) -> str:
    while type_string.startswith("array[") and type_string.endswith("]"):
        type_string = type_string[6:-1]
    return type_string


def _copy_metadata(src, writer) -> None:
    for key, value in src.metadata().items():
        if not key.startswith("split."):
            writer.set(key, value, _leaf_type(src.key_type(key)))


def _check_new(path: str) -> None:
    if os.path.exists(path):
        raise FileExistsError(f"{path}: already exists; not overwriting it")


def split(input_path: str, prefix: str, max_bytes: int = 0, max_tensors: int = 0,
          no_tensor_first_split: bool = False, dry_run: bool = False) -> list:
    """Write IN (a whole file or a split model's first shard) as shards PREFIX-0000k-of-0000N.gguf;
    returns their paths. With no limit given, at most 128 tensors a shard, llama-gguf-split's default."""
    if max_bytes and max_tensors:
        raise ValueError("give either a size limit or a tensor limit, not both (as llama-gguf-split)")
    if max_bytes < 0 or max_tensors < 0:
        raise ValueError(f"split limits must be positive (got size {max_bytes}, tensors {max_tensors})")
    if not max_bytes and not max_tensors:
        max_tensors = DEFAULT_MAX_TENSORS
    src = _ember.GGUFFile(input_path)
    tensors = src.tensors()
    shard_of = plan([t["nbytes"] for t in tensors], max_bytes, max_tensors, src.alignment)
    if no_tensor_first_split:
        shard_of = [s + 1 for s in shard_of]
    n_split = (shard_of[-1] + 1) if shard_of else 1
    if n_split > 99999:
        raise ValueError(f"the split limits make {n_split} shards, more than a shard name can number (99999)")
    paths = [split_path(prefix, k, n_split) for k in range(n_split)]
    if dry_run:
        return paths
    for p in paths:
        _check_new(p)
    for k, path in enumerate(paths):
        w = _ember.GGUFWriter(path, src.alignment)
        if k == 0:
            _copy_metadata(src, w)
        # llama-gguf-split's key order (it sets split.count last), so both tools write the same bytes.
        w.set(SPLIT_NO, k, "uint16")
        w.set(SPLIT_TENSORS_COUNT, len(tensors), "int32")
        w.set(SPLIT_COUNT, n_split, "uint16")
        mine = [t for t, s in zip(tensors, shard_of) if s == k]
        for t in mine:
            w.add_tensor_info(t["name"], t["type"], t["ne"])
        w.write_header()
        for t in mine:
            w.write_tensor_data(src.tensor_data(t["name"]))
        w.finish()
    return paths


def merge(first_shard: str, output_path: str) -> str:
    """Write the split model whose first shard is given as one file, without the split keys."""
    _check_new(output_path)
    src = _ember.GGUFFile(first_shard)
    if output_path in src.split_paths:
        raise ValueError(f"{output_path}: is one of the input's shards")
    w = _ember.GGUFWriter(output_path, src.alignment)
    _copy_metadata(src, w)
    tensors = src.tensors()
    for t in tensors:
        w.add_tensor_info(t["name"], t["type"], t["ne"])
    w.write_header()
    for t in tensors:
        w.write_tensor_data(src.tensor_data(t["name"]))
    w.finish()
    return output_path


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-gguf-split", description=__doc__.splitlines()[0])
    op = ap.add_mutually_exclusive_group()
    op.add_argument("--split", action="store_true", help="split IN into shards OUT-0000k-of-0000N.gguf (default)")
    op.add_argument("--merge", action="store_true", help="merge the shards of IN (its first shard) into OUT")
    limit = ap.add_mutually_exclusive_group()
    limit.add_argument("--split-max-tensors", type=int, metavar="N",
                       help=f"at most N tensors a shard (default {DEFAULT_MAX_TENSORS})")
    limit.add_argument("--split-max-size", type=parse_size, metavar="N(M|G)",
                       help="at most this many tensor bytes a shard (M = 1000^2, G = 1000^3 bytes); "
                       "a tensor larger than that gets a shard of its own")
    ap.add_argument("--no-tensor-first-split", action="store_true",
                    help="the first shard holds only the metadata, no tensors")
    ap.add_argument("--dry-run", action="store_true", help="print the shards that would be written; write nothing")
    ap.add_argument("input", help="GGUF file to split, or the first shard to merge")
    ap.add_argument("output", help="prefix of the shards (split) or the merged file")
    add_version(ap)
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.split_max_tensors is not None and args.split_max_tensors < 1:
        ap.error(f"--split-max-tensors must be at least 1 (got {args.split_max_tensors})")

    def run():
        if args.merge:
            print(f"wrote {merge(args.input, args.output)}", file=sys.stderr)
            return 0
        paths = split(args.input, args.output, args.split_max_size or 0, args.split_max_tensors or 0,
                      args.no_tensor_first_split, args.dry_run)
        verb = "would write" if args.dry_run else "wrote"
        print(f"{verb} {len(paths)} shards: " + ", ".join(paths), file=sys.stderr)
        return 0

    return run_tool("ember-gguf-split", run)


if __name__ == "__main__":
    sys.exit(main())
