"""ember-quantize --imatrix: Q4_K, Q5_K and Q6_K quantized with each column's importance weighting
the error search lose less importance-weighted error than without, on random heavy-tailed rows with
skewed (log-normal) importances; tensors without an entry are quantized as before; an entry of the
wrong width is refused; the CLI reads the file ember-imatrix / llama-imatrix write."""
import subprocess
import sys

import gguf
import gguf.quants
import numpy as np
import pytest
from gguf import GGUFReader

from ember import _ember as E
from ember import imatrix

from conftest import rng_for

N_IN, N_ROWS = 512, 96


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rng = rng_for("quantize imatrix")
    path = tmp_path_factory.mktemp("qim") / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for name in ("blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"):
        w.add_tensor(name, (rng.standard_t(5, (N_ROWS, N_IN)) * 0.05).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    importance = np.exp(2.0 * rng.standard_normal(N_IN)).astype(np.float32)
    return str(path), importance


def tensors(path: str) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


def weighted_error(src, dst, importance) -> float:
    x = np.asarray(src.data, dtype=np.float64).reshape(-1, N_IN)
    y = gguf.quants.dequantize(np.asarray(dst.data), dst.tensor_type).reshape(-1, N_IN).astype(np.float64)
    return float((importance * (x - y) ** 2).sum())


@pytest.mark.parametrize("mix", ["Q4_K", "Q5_K", "Q6_K"])
def test_importance_lowers_the_weighted_error(model, tmp_path, mix):
    path, importance = model
    plain, weighted = str(tmp_path / "plain.gguf"), str(tmp_path / "weighted.gguf")
    E.quantize_model(path, plain, mix, n_threads=2)
    E.quantize_model(path, weighted, mix, n_threads=2, imatrix={"blk.0.ffn_up.weight": importance.tolist()})
    src, a, b = tensors(path), tensors(plain), tensors(weighted)
    assert b["blk.0.ffn_up.weight"].tensor_type.name == mix
    err_plain = weighted_error(src["blk.0.ffn_up.weight"], a["blk.0.ffn_up.weight"], importance)
    err_weighted = weighted_error(src["blk.0.ffn_up.weight"], b["blk.0.ffn_up.weight"], importance)
    # measured: about 0.5 (Q4_K) and 0.63 (Q5_K, Q6_K) of the error without
    assert err_weighted < 0.8 * err_plain, (err_weighted, err_plain)
    # the tensor without an entry: the same bytes as without an imatrix
    np.testing.assert_array_equal(np.asarray(a["blk.0.ffn_gate.weight"].data),
                                  np.asarray(b["blk.0.ffn_gate.weight"].data))


def test_wrong_width_refused(model, tmp_path):
    path, importance = model
    out = tmp_path / "o.gguf"
    with pytest.raises(ValueError, match=r"--imatrix: the entry for 'blk.0.ffn_up.weight' has 100 columns, but its "
                                         r"rows have 512 elements"):
        E.quantize_model(path, str(out), "Q4_K", imatrix={"blk.0.ffn_up.weight": importance[:100].tolist()})
    assert not out.exists()


def test_cli_reads_an_imatrix_file(model, tmp_path):
    path, importance = model
    counts = np.array([384])
    m = imatrix.Imatrix({"blk.0.ffn_up.weight": imatrix.Entry((importance * counts[0]).reshape(1, -1), counts)},
                        ["t.txt"], 3, 128)
    imatrix.write(str(tmp_path / "im.gguf"), m)
    out = tmp_path / "cli.gguf"
    r = subprocess.run([sys.executable, "-m", "ember.quantize", path, str(out), "Q4_K", "-t", "2", "--imatrix",
                        str(tmp_path / "im.gguf")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "imatrix: 1 entries from" in r.stderr
    ref = tmp_path / "ref.gguf"
    entry = imatrix.read(str(tmp_path / "im.gguf")).entries["blk.0.ffn_up.weight"]
    weights = {"blk.0.ffn_up.weight": entry.importance()[0].tolist()}
    # the CLI also records the matrix's file, dataset and chunks (quantize.imatrix.*), as llama-quantize
    E.quantize_model(path, str(ref), "Q4_K", n_threads=2, imatrix=weights, imatrix_file=str(tmp_path / "im.gguf"),
                     imatrix_dataset="t.txt", imatrix_chunks=3)
    assert out.read_bytes() == ref.read_bytes()
