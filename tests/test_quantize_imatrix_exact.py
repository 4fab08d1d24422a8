"""ember-quantize --imatrix writes Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_XS, IQ4_NL, IQ3_XXS,
IQ3_S, IQ2_XXS, IQ2_XS and IQ2_S tensors byte for byte as llama-quantize does with the same importances (ggml's
quantize_q2_K etc. given quant_weights), and IQ3_XXS, IQ3_S and IQ2_S without: the rows and importances of
tests/reference/quant/<type>_imatrix_ggml.npz and <type>_search_ggml.npz (tools/gen_ggml_quant_reference.py:
normal, heavy-tailed, tiny, huge, ties between IQ4_NL's levels, zero blocks; log-normal importances with a run
of zero columns)."""
import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from conftest import ROOT
from ember import _ember

BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "IQ4_XS": 136, "IQ4_NL": 18, "IQ3_XXS": 98, "IQ3_S": 110, "IQ2_XXS": 66,
               "IQ2_XS": 74, "IQ2_S": 82, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24,
               "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def quantize(tmp_path, x, type_name, qw, name="blk.0.ffn_up.weight"):
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    imatrix = {name: qw.tolist()} if qw is not None else {}
    _ember.quantize_model(str(src), str(out), "q8_0", n_threads=2, tensor_types=[f"{name}={type_name}"],
                          imatrix=imatrix)
    t = GGUFReader(str(out)).tensors[0]
    assert t.tensor_type.name == type_name
    return np.asarray(t.data).reshape(-1).view(np.uint8)


@pytest.mark.parametrize("type_name", list(BLOCK_BYTES))
def test_as_llama_quantize_with_importances(tmp_path, type_name):
    ref = np.load(ROOT / "tests" / "reference" / "quant" / f"{type_name.lower()}_imatrix_ggml.npz")
    got = quantize(tmp_path, ref["x"], type_name, ref["qw"]).reshape(-1, BLOCK_BYTES[type_name])
    want = ref["q"].reshape(-1, BLOCK_BYTES[type_name])
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"{bad.size} of {len(want)} blocks differ, first {bad[:8]}"


@pytest.mark.parametrize("type_name", ["IQ3_XXS", "IQ3_S", "IQ2_S"])
def test_as_llama_quantize_without_importances(tmp_path, type_name):
    """The token embedding: llama-quantize writes IQ3_XXS without importances only there (and on the output)."""
    ref = np.load(ROOT / "tests" / "reference" / "quant" / f"{type_name.lower()}_search_ggml.npz")
    got = quantize(tmp_path, ref["x"], type_name, None, "token_embd.weight").reshape(-1, BLOCK_BYTES[type_name])
    want = ref["q"].reshape(-1, BLOCK_BYTES[type_name])
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"{bad.size} of {len(want)} blocks differ, first {bad[:8]}"


@pytest.mark.parametrize("type_name", [t for t in BLOCK_BYTES if t not in ("IQ2_XXS", "IQ2_XS")])
def test_importances_change_the_blocks(tmp_path, type_name):
    """The importances are used: the same rows without them are another file."""
    ref = np.load(ROOT / "tests" / "reference" / "quant" / f"{type_name.lower()}_imatrix_ggml.npz")
    plain = quantize(tmp_path, ref["x"], type_name, None, "token_embd.weight")
    assert not np.array_equal(plain, ref["q"].reshape(-1))


@pytest.mark.parametrize("type_name", ["IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S"])
def test_lowest_bit_types_need_importances(tmp_path, type_name):
    """As llama-quantize: refused without an entry for the tensor (IQ2_XXS's and IQ2_XS's even on the token
    embedding, which they have no quantizer for without importances), before anything is written."""
    x = np.load(ROOT / "tests" / "reference" / "quant" / "q2_k_imatrix_ggml.npz")["x"]
    with pytest.raises(ValueError, match=rf"tensor 'blk.0.ffn_up.weight' in {type_name} needs an importance matrix: "
                                         r"pass --imatrix FILE"):
        quantize(tmp_path, x, type_name, None)
    assert not (tmp_path / "q.gguf").exists()
    with pytest.raises(ValueError, match=r"needs an importance matrix: the --imatrix file has no entry for it"):
        src, out = tmp_path / "f32.gguf", tmp_path / "o.gguf"
        _ember.quantize_model(str(src), str(out), "q8_0", tensor_types=[f"ffn_up={type_name}"],
                              imatrix={"blk.9.ffn_up.weight": [1.0] * 4096})
    if type_name in ("IQ2_XXS", "IQ2_XS"):
        with pytest.raises(ValueError, match=rf"tensor 'token_embd.weight' in {type_name} needs an importance"):
            quantize(tmp_path, x, type_name, None, "token_embd.weight")
