"""ember-quantize's Q2_K, Q3_K_S, Q3_K_M, Q3_K_L and IQ4_XS recipes (llama.cpp's llama_tensor_get_type for
those mixes): which type each tensor of a random 32-layer model gets (rows of 256 and of 64: the K types'
fallback to Q4_0, IQ4_XS's to IQ4_NL), with grouped-query attention below and at 4 heads a KV head, the
file_type written, and the blocks of a Q2_K / Q3_K / IQ4_XS tensor as the type's (ggml's) quantizer writes
them; IQ4_NL weights as llama-quantize writes them (ggml's quantize_iq4_nl, committed rows)."""
import numpy as np
import pytest
import gguf
from gguf import GGUFReader

from conftest import ROOT, kernel_module, rng_for
from ember import _ember

K = kernel_module()
N_LAYER = 32


def write_model(path, n_head, n_head_kv, rng):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(0)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)

    def mat(*shape):
        return (rng.standard_t(5, size=shape) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(40, 256))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", mat(256))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
            w.add_tensor(f"blk.{i}.{name}.weight", mat(64, 256))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(256, 512))
    w.add_tensor("blk.0.attn_qkv.weight", mat(64, 256))
    w.add_tensor("blk.0.ffn_narrow.weight", mat(8, 64))   # rows of 64: K types fall back
    w.add_tensor("output.weight", mat(40, 256))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def expected(mix, name, n_gqa):
    """llama.cpp's choice for the tensors of write_model (none of them 70B, MoE or Falcon)."""
    if name == "output.weight":
        return "Q6_K"
    if name.endswith("attn_norm.weight"):
        return "F32"
    if name == "blk.0.ffn_narrow.weight":
        return "IQ4_NL" if mix == "IQ4_XS" else "Q4_0"
    base = {"Q2_K": "Q2_K", "IQ4_XS": "IQ4_XS"}.get(mix, "Q3_K")
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    kind = name.split(".")[-2]
    # llama.cpp rules attn_qkv as attn_v and counts them together (blk.0.attn_qkv sorts before blk.0.attn_v)
    i_attn_v = 0 if kind == "attn_qkv" else layer + 1
    kind = "attn_v" if kind == "attn_qkv" else kind
    rules = {
        "Q2_K": {"attn_v": "Q4_K" if n_gqa >= 4 else "Q3_K", "ffn_down": "Q3_K", "attn_output": "Q3_K"},
        "Q3_K_M": {"attn_v": "Q5_K" if i_attn_v < 2 else "Q4_K",
                   "ffn_down": "Q5_K" if layer < N_LAYER // 16 else "Q4_K", "attn_output": "Q4_K"},
        "Q3_K_L": {"attn_v": "Q5_K", "ffn_down": "Q5_K", "attn_output": "Q5_K"},
        "Q3_K_S": {},
        "IQ4_XS": {"attn_v": "Q5_K" if n_gqa >= 4 else "IQ4_XS",
                   "ffn_down": "Q5_K" if layer < N_LAYER // 8 else "IQ4_XS"},
    }[mix]
    return rules.get(kind, base)


@pytest.mark.parametrize("n_head, n_head_kv", [(6, 2), (8, 2)], ids=["gqa3", "gqa4"])
@pytest.mark.parametrize("mix, file_type", [("Q2_K", 10), ("Q3_K_S", 11), ("Q3_K_M", 12), ("Q3_K_L", 13),
                                            ("IQ4_XS", 30)])
def test_low_k_recipes(tmp_path, mix, file_type, n_head, n_head_kv):
    rng = rng_for("low-k recipe", mix, n_head)
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    write_model(src, n_head, n_head_kv, rng)
    _ember.quantize_model(str(src), str(out), mix.lower(), n_threads=2)
    d = GGUFReader(str(out))
    assert int(d.fields["general.file_type"].parts[-1][0]) == file_type
    got = {t.name: t.tensor_type.name for t in d.tensors}
    want = {name: expected(mix, name, n_head // n_head_kv) for name in got}
    assert got == want, {k: (got[k], want[k]) for k in got if got[k] != want[k]}
    s = {t.name: t for t in GGUFReader(str(src)).tensors}
    for t in d.tensors:
        if t.tensor_type.name in ("Q2_K", "Q3_K", "IQ4_XS"):
            x = np.asarray(s[t.name].data, np.float32).reshape(-1)
            np.testing.assert_array_equal(np.asarray(t.data).reshape(-1).view(np.uint8),
                                          K.quantize(int(t.tensor_type), np.ascontiguousarray(x)), err_msg=t.name)


def test_iq4_nl_weights_as_llama_quantize(tmp_path):
    """IQ4_NL weights (an override here, IQ4_XS's fallback in its recipe) take ggml's quantize_iq4_nl, the 16
    candidate scales of IQ4_XS's search, not the KV cache's single fit: the bytes it writes for the rows of
    tests/reference/quant/iq4_nl_search_ggml.npz."""
    ref = np.load(ROOT / "tests" / "reference" / "quant" / "iq4_nl_search_ggml.npz")
    src, out = tmp_path / "f32.gguf", tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.ffn_up.weight", ref["x"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _ember.quantize_model(str(src), str(out), "q8_0", n_threads=2, tensor_types=["ffn_up=IQ4_NL"])
    t = GGUFReader(str(out)).tensors[0]
    assert t.tensor_type.name == "IQ4_NL"
    got, want = np.asarray(t.data).reshape(-1, 18), ref["q"].reshape(-1, 18)
    zero = want[:, :2].copy().view(np.uint16)[:, 0] == 0   # ggml leaves a zero block's quants unset
    np.testing.assert_array_equal(got[~zero], want[~zero])
    np.testing.assert_array_equal(got[zero, :2], want[zero, :2])
