"""Writes tests/reference/imatrix/qwen3moe_tiny_c64.npz: llama-imatrix on the synthetic qwen3moe-tiny model of seed
MOE_SEED (tests/test_imatrix_experts.py builds the same), over tests/reference/smollm2/apache-2.0.txt with n_ctx 64 and
2 chunks: every entry's per-matrix token counts, and the column sums of layer 0's and layer 3's expert tensors.
Run: python tools/gen_imatrix_moe_reference.py /path/to/llama.cpp/build/bin/llama-imatrix"""
import gzip
import importlib.util
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "python"))

from conftest import REFERENCE  # noqa: E402
from ember import imatrix  # noqa: E402

OUT = ROOT / "tests" / "reference" / "imatrix" / "qwen3moe_tiny_c64.npz"
MOE_SEED = 20261207


def main():
    spec = importlib.util.spec_from_file_location("synthetic_gguf", ROOT / "tools" / "synthetic_gguf.py")
    synthetic_gguf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic_gguf)
    with tempfile.TemporaryDirectory() as d:
        vocab = pathlib.Path(d) / "smollm2-vocab.gguf"
        vocab.write_bytes(gzip.decompress((ROOT / "tests" / "fuzz" / "vocab" / "smollm2.gguf.gz").read_bytes()))
        model = str(pathlib.Path(d) / "qwen3moe-tiny.gguf")
        synthetic_gguf.write_model(model, "qwen3moe-tiny", str(vocab), ctx=256,
                                   seed=MOE_SEED)
        out = str(pathlib.Path(d) / "imatrix.gguf")
        subprocess.run([sys.argv[1], "-m", model, "-f", str(REFERENCE / "apache-2.0.txt"), "-c", "64", "--chunks", "2",
                        "-t", "2", "-o", out], check=True, capture_output=True)
        m = imatrix.read(out)
    names = sorted(m.entries)
    arrays = {"names": np.array(names), **{f"counts:{n}": m.entries[n].counts for n in names}}
    arrays.update({f"sums:{n}": m.entries[n].sums for n in names if "_exps" in n and n.split(".")[1] in ("0", "3")})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
