"""ember-quantize's IQ1_S and IQ1_M: their quantizers byte for byte llama-quantize's (ggml's quantize_iq1_s /
quantize_iq1_m given the same importances; IQ1_M also without, as on a token embedding) on the rows of
tests/reference/quant/iq1_*_ggml.npz (tools/gen_ggml_quant_reference.py: normal, heavy-tailed, tiny, huge, ties
between levels, zero blocks, a row of few distinct values; log-normal importances with a run of zero columns), their
mixes (llama.cpp's llama_tensor_get_type: the IQ2_XXS rules, attn_output in IQ2_XXS), the fallback to IQ4_NL for rows
not a multiple of 256, and the refusals without an importance matrix."""
import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from conftest import ROOT, rng_for
from ember import _ember
from test_quantize_imatrix_exact import quantize
from test_quantize_low_k import N_LAYER, write_model

BLOCK_BYTES = {"IQ1_S": 50, "IQ1_M": 56}
REF = ROOT / "tests" / "reference" / "quant"


def differing_blocks(got, want, type_name):
    got, want = got.reshape(-1, BLOCK_BYTES[type_name]), want.reshape(-1, BLOCK_BYTES[type_name])
    return np.flatnonzero((got != want).any(axis=1)), len(want)


@pytest.mark.parametrize("type_name", ["IQ1_S", "IQ1_M"])
def test_as_llama_quantize_with_importances(tmp_path, type_name):
    ref = np.load(REF / f"{type_name.lower()}_imatrix_ggml.npz")
    bad, n = differing_blocks(quantize(tmp_path, ref["x"], type_name, ref["qw"]), ref["q"], type_name)
    assert bad.size == 0, f"{bad.size} of {n} blocks differ, first {bad[:8]}"


def test_iq1_m_as_llama_quantize_without_importances(tmp_path):
    """The token embedding: the one place llama-quantize writes IQ1_M without importances (the values' squares
    then weigh the errors)."""
    ref = np.load(REF / "iq1_m_search_ggml.npz")
    bad, n = differing_blocks(quantize(tmp_path, ref["x"], "IQ1_M", None, "token_embd.weight"), ref["q"], "IQ1_M")
    assert bad.size == 0, f"{bad.size} of {n} blocks differ, first {bad[:8]}"


def test_importances_change_the_blocks(tmp_path):
    ref = np.load(REF / "iq1_m_imatrix_ggml.npz")
    assert not np.array_equal(quantize(tmp_path, ref["x"], "IQ1_M", None, "token_embd.weight"), ref["q"].reshape(-1))


@pytest.mark.parametrize("type_name", ["IQ1_S", "IQ1_M"])
def test_fresh_rows_decode_near_their_values(tmp_path, type_name):
    """Fresh random rows and importances: the blocks dequantize to a fit of the rows (a third of their spread at
    most, 1.5-1.75 bits a value), and the most important columns are fitted better than the rest."""
    rng = rng_for("iq1 fresh rows", type_name)
    x = (rng.standard_normal((6, 1024)) * rng.uniform(0.01, 2.0, (6, 1))).astype(np.float32)
    qw = np.exp(2.0 * rng.standard_normal(1024)).astype(np.float32)
    q = quantize(tmp_path, x, type_name, qw)
    y = gguf.quants.dequantize(q.reshape(6, -1), gguf.GGMLQuantizationType[type_name])
    err = (y - x) ** 2
    assert err.mean() < 0.35 * (x**2).mean()
    top = qw > np.quantile(qw, 0.9)
    assert err[:, top].mean() < err[:, ~top].mean()


@pytest.mark.parametrize("type_name", ["IQ1_S", "IQ1_M"])
def test_need_importances(tmp_path, type_name):
    """As llama-quantize: refused without an entry for the tensor, before anything is written; IQ1_S even on the
    token embedding, where ggml's quantizer has no way without importances."""
    x = rng_for("iq1 refused", type_name).standard_normal((4, 256)).astype(np.float32)
    with pytest.raises(ValueError, match=rf"tensor 'blk.0.ffn_up.weight' in {type_name} needs an importance matrix: "
                                         r"pass --imatrix FILE"):
        quantize(tmp_path, x, type_name, None)
    assert not (tmp_path / "q.gguf").exists()
    with pytest.raises(ValueError, match=r"needs an importance matrix: the --imatrix file has no entry for it"):
        _ember.quantize_model(str(tmp_path / "f32.gguf"), str(tmp_path / "o.gguf"), "q8_0",
                              tensor_types=[f"ffn_up={type_name}"], imatrix={"blk.9.ffn_up.weight": [1.0] * 256})
    if type_name == "IQ1_S":
        with pytest.raises(ValueError, match=r"tensor 'token_embd.weight' in IQ1_S needs an importance matrix"):
            quantize(tmp_path, x, type_name, None, "token_embd.weight")


@pytest.mark.parametrize("type_name", ["IQ1_S", "IQ1_M"])
def test_rows_not_a_multiple_of_256_fall_back_to_iq4_nl(tmp_path, type_name):
    """As llama-quantize's tensor_type_fallback: rows of 288 go to IQ4_NL, with the same importances."""
    rng = rng_for("iq1 fallback", type_name)
    x = rng.standard_normal((5, 288)).astype(np.float32)
    qw = np.exp(rng.standard_normal(288)).astype(np.float32)
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.ffn_up.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    imatrix = {"blk.0.ffn_up.weight": qw.tolist()}
    _ember.quantize_model(str(src), str(out), "q8_0", tensor_types=[f"ffn_up={type_name}"], imatrix=imatrix)
    got = GGUFReader(str(out)).tensors[0]
    assert got.tensor_type.name == "IQ4_NL"
    _ember.quantize_model(str(src), str(tmp_path / "nl.gguf"), "q8_0", tensor_types=["ffn_up=IQ4_NL"], imatrix=imatrix)
    assert np.array_equal(np.asarray(got.data), np.asarray(GGUFReader(str(tmp_path / "nl.gguf")).tensors[0].data))


def expected(mix, name, n_gqa):
    """llama.cpp's choice for write_model's tensors under the IQ1 mixes (no experts)."""
    if name == "output.weight":
        return "Q5_K"
    if name == "token_embd.weight":
        return "Q2_K"
    if name.endswith("attn_norm.weight"):
        return "F32"
    if name == "blk.0.ffn_narrow.weight":
        return "IQ4_NL"
    layer = int(name.split(".")[1])
    kind = name.split(".")[-2]
    kind = "attn_v" if kind == "attn_qkv" else kind   # llama.cpp rules attn_qkv as attn_v
    rules = {"attn_v": "Q4_K" if n_gqa >= 4 else "Q2_K", "ffn_down": "Q2_K" if layer < N_LAYER // 8 else mix,
             "attn_output": "IQ2_XXS"}
    return rules.get(kind, mix)


@pytest.mark.parametrize("mix, file_type, n_head, n_head_kv", [("IQ1_S", 24, 6, 2), ("IQ1_M", 31, 8, 2)],
                         ids=["IQ1_S-gqa3", "IQ1_M-gqa4"])
def test_iq1_recipes(tmp_path, mix, file_type, n_head, n_head_kv):
    """attn_v's rule differs below and at 4 query heads a KV head; the two mixes differ only in their base type."""
    rng = rng_for("iq1 recipe", mix, n_head)
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    write_model(src, n_head, n_head_kv, rng)
    weights = {t.name: np.exp(rng.standard_normal(int(t.shape[0]))).tolist()
               for t in GGUFReader(str(src)).tensors if len(t.shape) == 2}
    _ember.quantize_model(str(src), str(out), mix.lower(), n_threads=2, imatrix=weights)
    d = GGUFReader(str(out))
    assert int(d.fields["general.file_type"].parts[-1][0]) == file_type
    got = {t.name: t.tensor_type.name for t in d.tensors}
    want = {name: expected(mix, name, n_head // n_head_kv) for name in got}
    assert got == want, {k: (got[k], want[k]) for k in got if got[k] != want[k]}


@pytest.mark.parametrize("mix", ["IQ1_S", "IQ1_M"])
def test_mix_needs_an_imatrix(tmp_path, mix):
    src = tmp_path / "f32.gguf"
    write_model(src, 6, 2, rng_for("iq1 mix without imatrix", mix))
    with pytest.raises(ValueError, match=rf"tensor 'blk.0.attn_q.weight' in {mix} needs an importance matrix: pass "
                                         r"--imatrix FILE"):
        _ember.quantize_model(str(src), str(tmp_path / "o.gguf"), mix.lower())
    assert not (tmp_path / "o.gguf").exists()
