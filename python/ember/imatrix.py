"""ember-imatrix: the importance matrix of a model over a text, as llama-imatrix computes and writes it.

    ember-imatrix -m MODEL -f TEXT [-o imatrix.gguf] [-c N_CTX] [--chunks N] [--process-output] [-t N]

The text's tokens are cut into chunks of N_CTX (each starting with BOS where the model adds one, as
llama-imatrix and ember-perplexity do), each evaluated alone; every block weight's inputs are recorded
(the output head's too with --process-output). The GGUF file holds, per weight matrix NAME,
NAME.in_sum2 [n_mat][n_in] = the sum over tokens of each input column's squared activation and
NAME.counts [n_mat][1] = the tokens summed (n_mat: the expert count of a stacked expert tensor, else 1).
A stacked expert tensor's rows are each expert's own: the inputs of the tokens routed to it, and their
count. The older .dat format is read into the same form. Collection runs on the CPU.
"""
import argparse
import dataclasses
import struct
import sys
from typing import Dict, List

import numpy as np

from . import _ember, options
from .cli import run_tool
from .perplexity import text_chunks
from .version import add_version

GGUF_MAGIC = b"GGUF"
SUM2, COUNTS = ".in_sum2", ".counts"
KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"


@dataclasses.dataclass
class Entry:
    sums: np.ndarray     # float32 [n_mat][n_in]
    counts: np.ndarray   # int64 [n_mat]

    def importance(self) -> np.ndarray:
        """The mean squared activation per input column [n_mat][n_in]: what the quantizer weighs
        each column's error by. A matrix (expert) that saw no token gets ones, as llama.cpp does."""
        out = np.ones_like(self.sums)
        seen = self.counts > 0
        out[seen] = self.sums[seen] / self.counts[seen, None]
        return out


@dataclasses.dataclass
class Imatrix:
    entries: Dict[str, Entry]
    datasets: List[str] = dataclasses.field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0   # tokens a chunk; 0 where the file does not say (the .dat format)


def read(path: str) -> Imatrix:
    """Either format, told apart by the GGUF magic; ValueError naming the file and what is wrong."""
    with open(path, "rb") as f:
        magic = f.read(4)
    return _read_gguf(path) if magic == GGUF_MAGIC else _read_dat(path)


def _read_gguf(path: str) -> Imatrix:
    import gguf

    r = gguf.GGUFReader(path)
    sums, counts = {}, {}
    for t in r.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"{path}: imatrix tensor '{t.name}' is {t.tensor_type.name}, not F32")
        data = np.asarray(t.data, dtype=np.float32)
        if t.name.endswith(SUM2):
            sums[t.name[: -len(SUM2)]] = data.reshape(-1, int(t.shape[0]))
        elif t.name.endswith(COUNTS):
            counts[t.name[: -len(COUNTS)]] = np.rint(data.reshape(-1)).astype(np.int64)
    if not sums:
        raise ValueError(f"{path}: no '*{SUM2}' tensors: not an imatrix file")
    entries = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            missing = SUM2 if name not in sums else COUNTS
            raise ValueError(f"{path}: '{name}' has no '{name}{missing}' tensor")
        if sums[name].shape[0] != counts[name].shape[0]:
            raise ValueError(f"{path}: '{name}' has {sums[name].shape[0]} rows of sums but "
                             f"{counts[name].shape[0]} counts")
        entries[name] = Entry(sums[name], counts[name])

    def scalar(key):
        field = r.fields.get(key)
        return int(field.parts[field.data[0]][0]) if field else 0

    field = r.fields.get(KEY_DATASETS)
    datasets = [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data] if field else []
    return Imatrix(entries, datasets, scalar(KEY_CHUNK_COUNT), scalar(KEY_CHUNK_SIZE))


def _read_dat(path: str) -> Imatrix:
    """The .dat layout: int32 entry count; per entry int32 name length, the name, int32 ncall, int32
    value count, the values (mean squares times ncall); then, optionally, int32 chunk count and the
    dataset's name. Its values are read as sums over ncall tokens, as llama.cpp's loader does."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt: str, what: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ValueError(f"{path}: file ends inside {what} (offset {pos}): not an imatrix .dat file, or cut short")
        out = struct.unpack_from(fmt, data, pos)
        pos += size
        return out

    (n_entries,) = take("<i", "the entry count")
    if n_entries < 1:
        raise ValueError(f"{path}: not an imatrix file (it starts with entry count {n_entries})")
    entries = {}
    for i in range(n_entries):
        (n,) = take("<i", f"entry {i}'s name length")
        if n < 1 or n > 4096:
            raise ValueError(f"{path}: entry {i} has a name length of {n}: not an imatrix .dat file")
        name = take(f"<{n}s", f"entry {i}'s name")[0].decode("utf-8", errors="replace")
        ncall, nval = take("<ii", f"entry '{name}'")
        if nval < 1:
            raise ValueError(f"{path}: entry '{name}' has {nval} values")
        values = np.frombuffer(data, dtype="<f4", count=nval, offset=pos) if pos + 4 * nval <= len(data) else None
        if values is None:
            raise ValueError(f"{path}: file ends inside entry '{name}''s {nval} values")
        pos += 4 * nval
        entries[name] = Entry(values.astype(np.float32).reshape(1, -1), np.array([ncall], dtype=np.int64))
    chunk_count, datasets = 0, []
    if pos + 4 <= len(data):
        (chunk_count,) = take("<i", "the chunk count")
        if pos + 4 <= len(data):
            (n,) = take("<i", "the dataset name length")
            if 0 < n <= len(data) - pos:
                datasets.append(take(f"<{n}s", "the dataset name")[0].decode("utf-8", errors="replace"))
    return Imatrix(entries, datasets, chunk_count, 0)


def write(path: str, imatrix: Imatrix) -> None:
    """The GGUF format in llama-imatrix's layout: general.type "imatrix", the three imatrix.* keys, no
    architecture, and per matrix in name order its in_sum2 ([n_in], or [n_mat][n_in] for experts) then
    its counts ([1], or [n_mat][1])."""
    import gguf

    class _Writer(gguf.GGUFWriter):
        def add_architecture(self) -> None:   # an imatrix belongs to no architecture
            pass

    w = _Writer(path, arch="")
    w.add_type("imatrix")
    w.add_array(KEY_DATASETS, list(imatrix.datasets))
    w.add_uint32(KEY_CHUNK_COUNT, int(imatrix.chunk_count))
    w.add_uint32(KEY_CHUNK_SIZE, int(imatrix.chunk_size))
    for name in sorted(imatrix.entries):
        e = imatrix.entries[name]
        sums = np.ascontiguousarray(e.sums, dtype=np.float32)
        if sums.ndim != 2 or e.counts.shape != (sums.shape[0],):
            raise ValueError(f"imatrix entry '{name}': sums must be [n_mat][n_in] with n_mat counts, got "
                             f"{sums.shape} and {e.counts.shape}")
        counts = e.counts.astype(np.float32).reshape(-1, 1)
        # ggml stores no trailing dimensions of 1: one matrix's entry is 1-D, as llama-imatrix's files have it
        w.add_tensor(name + SUM2, sums if len(sums) > 1 else sums[0])
        w.add_tensor(name + COUNTS, counts if len(counts) > 1 else counts[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def collect(model, text: bytes, n_ctx: int, n_threads: int = 0, max_chunks: int = 0, process_output: bool = False,
            dataset: str = "", out=sys.stderr) -> Imatrix:
    """The importance matrix of model over text's first max_chunks chunks of n_ctx tokens (0: all)."""
    chunks, n_tokens = text_chunks(model, text, n_ctx, max_chunks)
    print(f"ember-imatrix: {n_tokens} tokens, {len(chunks)} chunks of {n_ctx}", file=out)
    _ember.imatrix_start(process_output)
    try:
        ctx = _ember.Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads)
        for c, chunk in enumerate(chunks):
            ctx.truncate(0)
            ctx.eval(chunk)
            print(f"[{c + 1}/{len(chunks)}]", end=" ", file=out, flush=True)
        print(file=out)
    finally:
        stats = _ember.imatrix_stop()
    entries = {name: Entry(np.asarray(sums, np.float32).reshape(len(counts), -1), np.array(counts, np.int64))
               for name, (sums, counts) in stats.items()}
    return Imatrix(entries, [dataset] if dataset else [], len(chunks), n_ctx)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-imatrix", description=__doc__.splitlines()[0])
    ap.add_argument("-f", "--file", required=True, help="text file to compute the matrix over")
    ap.add_argument("-o", "--output", default="imatrix.gguf", help="GGUF file to write (default: imatrix.gguf)")
    ap.add_argument("--chunks", type=int, default=-1, metavar="N",
                    help="the first N chunks only (default: -1, every whole chunk of the file)")
    ap.add_argument("--process-output", action="store_true", help="collect the output head too")
    options.add_arguments(ap, options.PERPLEXITY)
    add_version(ap)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return run_tool("ember-imatrix", lambda: _run(args))


def _run(args) -> int:
    if args.chunks == 0 or args.chunks < -1:
        raise ValueError(f"--chunks must be a number of chunks >= 1 (or -1: all), got {args.chunks}")
    with open(args.file, "rb") as f:
        text = f.read()
    model = _ember.Model(args.model, options.fill(_ember.ModelParams(), vars(args)))
    n_ctx = options.context_size(model, args.n_ctx)
    m = collect(model, text, n_ctx, args.n_threads or 0, max(args.chunks, 0), args.process_output, args.file)
    write(args.output, m)
    print(f"ember-imatrix: wrote {len(m.entries)} matrices over {m.chunk_count} chunks to {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
