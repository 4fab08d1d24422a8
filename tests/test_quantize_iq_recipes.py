"""ember-quantize's IQ3_S, IQ3_M, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S and IQ2_M recipes (llama.cpp's
llama_tensor_get_type for those mixes): which type each tensor of test_quantize_low_k's random 32-layer model gets
(rows of 256, of 512 and of 64: the IQ types' fallback to IQ4_NL), with grouped-query attention below and at 4
heads a KV head, and the file_type written (the lowest-bit mixes with an importance matrix, which they need); an
IQ override refused on rows no fallback divides."""
import numpy as np
import pytest
from gguf import GGUFReader

from conftest import rng_for
from ember import _ember
from test_quantize_low_k import N_LAYER, write_model


BASE = {"IQ3_S": "IQ3_S", "IQ3_M": "IQ3_S", "IQ3_XXS": "IQ3_XXS", "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS",
        "IQ2_S": "IQ2_XS", "IQ2_M": "IQ2_S"}


def expected(mix, name, n_gqa):
    if name == "output.weight":
        return "Q6_K" if mix in ("IQ3_S", "IQ3_M") else "Q5_K"
    if name == "token_embd.weight":
        return {"IQ2_XXS": "Q2_K", "IQ2_XS": "Q2_K", "IQ2_S": "IQ3_S", "IQ2_M": "IQ3_S", "IQ3_XXS": "IQ3_S"}.get(
            mix, BASE[mix])
    if name.endswith("attn_norm.weight"):
        return "F32"
    if name == "blk.0.ffn_narrow.weight":
        return "IQ4_NL"
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    kind = name.split(".")[-2]
    kind = "attn_v" if kind == "attn_qkv" else kind   # llama.cpp rules attn_qkv as attn_v
    more = "IQ3_S" if mix in ("IQ2_S", "IQ2_M") else "Q2_K"
    iq2 = {"attn_v": "Q4_K" if n_gqa >= 4 else more, "ffn_down": more if layer < N_LAYER // 8 else BASE[mix]}
    rules = {
        "IQ3_S": {"attn_v": "Q4_K" if n_gqa >= 4 else "IQ3_S"},
        "IQ3_M": {"attn_v": "Q4_K", "ffn_down": "Q4_K" if layer < N_LAYER // 8 else "IQ3_S", "attn_output": "Q4_K"},
        "IQ3_XXS": {"attn_v": "Q4_K" if n_gqa >= 4 else "IQ3_XXS", "attn_q": "IQ2_S", "attn_k": "IQ2_S",
                    "attn_output": "IQ3_S"},
        "IQ2_XXS": iq2, "IQ2_XS": iq2, "IQ2_S": {**iq2, "attn_output": "IQ3_S"},
        "IQ2_M": {**iq2, "attn_output": "IQ3_S"},
    }[mix]
    return rules.get(kind, BASE[mix])


@pytest.mark.parametrize("n_head, n_head_kv", [(6, 2), (8, 2)], ids=["gqa3", "gqa4"])
@pytest.mark.parametrize("mix, file_type", [("IQ3_S", 26), ("IQ3_M", 27), ("IQ3_XXS", 23), ("IQ2_XXS", 19),
                                            ("IQ2_XS", 20), ("IQ2_S", 28), ("IQ2_M", 29)])
def test_iq_recipes(tmp_path, mix, file_type, n_head, n_head_kv):
    rng = rng_for("iq recipe", mix, n_head)
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    write_model(src, n_head, n_head_kv, rng)
    weights = {t.name: np.exp(rng.standard_normal(int(t.shape[0]))).tolist()
               for t in GGUFReader(str(src)).tensors if len(t.shape) == 2}
    _ember.quantize_model(str(src), str(out), mix.lower(), n_threads=2,
                          imatrix={} if mix in ("IQ3_S", "IQ3_M") else weights)
    d = GGUFReader(str(out))
    assert int(d.fields["general.file_type"].parts[-1][0]) == file_type
    got = {t.name: t.tensor_type.name for t in d.tensors}
    want = {name: expected(mix, name, n_head // n_head_kv) for name in got}
    assert got == want, {k: (got[k], want[k]) for k in got if got[k] != want[k]}


def test_lowest_bit_mix_needs_an_imatrix(tmp_path):
    src = tmp_path / "f32.gguf"
    write_model(src, 6, 2, rng_for("iq2 mix without imatrix"))
    with pytest.raises(ValueError, match=r"tensor 'blk.0.attn_q.weight' in IQ2_XXS needs an importance matrix: pass "
                                         r"--imatrix FILE"):
        _ember.quantize_model(str(src), str(tmp_path / "o.gguf"), "iq2_xxs")
    assert not (tmp_path / "o.gguf").exists()


def test_rows_too_short_refused(tmp_path):
    import gguf

    src = tmp_path / "f32.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.ffn_up.weight", rng_for("iq3 short rows").standard_normal((4, 48)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # IQ3_XXS falls back to IQ4_NL (as llama-quantize), whose blocks of 32 do not divide 48 either
    with pytest.raises(ValueError, match=r"'blk.0.ffn_up.weight' has rows of 48 elements, not a multiple of IQ4_NL"):
        _ember.quantize_model(str(src), str(tmp_path / "o.gguf"), "q8_0", tensor_types=["ffn_up=IQ3_XXS"])
