"""ember-quantize's IQ3_S and IQ3_M recipes (llama.cpp's llama_tensor_get_type for those mixes): which type each
tensor of test_quantize_low_k's random 32-layer model gets (rows of 256, of 512 and of 64: the IQ types' fallback
to IQ4_NL), with grouped-query attention below and at 4 heads a KV head, and the file_type written; the IQ3
types' override refused on rows no fallback divides."""
import numpy as np
import pytest
from gguf import GGUFReader

from conftest import rng_for
from ember import _ember
from test_quantize_low_k import N_LAYER, write_model


def expected(mix, name, n_gqa):
    if name == "output.weight":
        return "Q6_K"
    if name.endswith("attn_norm.weight"):
        return "F32"
    if name == "blk.0.ffn_narrow.weight":
        return "IQ4_NL"
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    kind = name.split(".")[-2]
    rules = {
        "IQ3_S": {"attn_v": "Q4_K" if n_gqa >= 4 else "IQ3_S"},
        "IQ3_M": {"attn_v": "Q4_K", "ffn_down": "Q4_K" if layer < N_LAYER // 8 else "IQ3_S", "attn_output": "Q4_K",
                  "attn_qkv": "Q4_K"},
    }[mix]
    return rules.get(kind, "IQ3_S")


@pytest.mark.parametrize("n_head, n_head_kv", [(6, 2), (8, 2)], ids=["gqa3", "gqa4"])
@pytest.mark.parametrize("mix, file_type", [("IQ3_S", 26), ("IQ3_M", 27)])
def test_iq3_recipes(tmp_path, mix, file_type, n_head, n_head_kv):
    rng = rng_for("iq3 recipe", mix, n_head)
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    write_model(src, n_head, n_head_kv, rng)
    _ember.quantize_model(str(src), str(out), mix.lower(), n_threads=2)
    d = GGUFReader(str(out))
    assert int(d.fields["general.file_type"].parts[-1][0]) == file_type
    got = {t.name: t.tensor_type.name for t in d.tensors}
    want = {name: expected(mix, name, n_head // n_head_kv) for name in got}
    assert got == want, {k: (got[k], want[k]) for k in got if got[k] != want[k]}


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
