"""Llama 4 (chunked local attention, NoPE layers with the attention temperature, L2 q/k norms, a
sigmoid-routed mixture with a shared expert between dense layers) and Command R+ (Command R with
per-head q/k LayerNorms): tiny random HF models (tools/gen_hf_references.py says how each was made)
converted by ember-convert. The GGUF keys and tensors must be those llama.cpp's converter writes,
ember's logits must match transformers' at f32 (a prompt of 40 tokens, five chunks of 8; one batch,
token by token and inside an engine batch), and configs or files ember cannot run give a clear error."""
import json
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to read converted files")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402
from hf_tiny import hf_reference  # noqa: E402,F401 (a fixture)

from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

PROMPT = hf_tiny.LONG_PROMPT
MODELS = ["llama4", "command-r-plus"]
GREEDY = hf_tiny.ROOT / "tests" / "reference" / "llama4" / "llama_cpp_greedy.json"
# What llama.cpp's llama4 fixes whatever the file says (chunks of 8192, temperature 0.1 over 8192 positions).
LLAMA_CPP_KEYS = dict(floats={"attention.temperature_scale": 0.1},
                      uints={"attention.sliding_window": 8192, "attention.temperature_length": 8192})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    return hf_tiny.converted(tmp_path_factory, MODELS, "llama4_models")


_fields = hf_tiny.gguf_fields
_tensors = hf_tiny.gguf_tensors


# ------------------------------------------------------------------------------------- metadata


def test_llama4_file(models):
    _, sd, path = models["llama4"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "llama4"
    assert kv["llama4.attention.sliding_window"] == 8
    assert kv["llama4.interleave_moe_layer_step"] == 2
    assert kv["llama4.expert_count"] == 4 and kv["llama4.expert_used_count"] == 1
    assert kv["llama4.expert_feed_forward_length"] == 48 and kv["llama4.feed_forward_length"] == 160
    assert kv["llama4.attention.temperature_scale"] == pytest.approx(0.5)
    assert kv["llama4.attention.temperature_length"] == 8
    attn = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"]
    dense = ["ffn_gate", "ffn_up", "ffn_down"]
    moe = ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp",
           "ffn_down_shexp"]
    want = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for i in range(4):
        want |= {f"blk.{i}.{n}.weight" for n in attn + (moe if i % 2 else dense)}
    assert set(t) == want
    # Rope on adjacent pairs as HF's complex rotation: Q and K rows as they are.
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"], sd["model.layers.0.self_attn.q_proj.weight"])
    gate_up = sd["model.layers.1.feed_forward.experts.gate_up_proj"]   # [X, E, 2F]: x @ W
    np.testing.assert_array_equal(t["blk.1.ffn_gate_exps.weight"], np.swapaxes(gate_up[:, :, :48], 1, 2))
    np.testing.assert_array_equal(t["blk.1.ffn_up_exps.weight"], np.swapaxes(gate_up[:, :, 48:], 1, 2))
    np.testing.assert_array_equal(t["blk.3.ffn_down_exps.weight"],
                                  np.swapaxes(sd["model.layers.3.feed_forward.experts.down_proj"], 1, 2))
    np.testing.assert_array_equal(t["blk.3.ffn_up_shexp.weight"],
                                  sd["model.layers.3.feed_forward.shared_expert.up_proj.weight"])


def test_command_r_plus_file(models):
    _, sd, path = models["command-r-plus"]
    t = _tensors(path)
    # A weight per head: [n_head, head_dim] (GGUF's {head_dim, n_head}), as HF keeps it.
    assert t["blk.1.attn_q_norm.weight"].shape == (4, 16) and t["blk.1.attn_k_norm.weight"].shape == (2, 16)
    np.testing.assert_array_equal(t["blk.1.attn_q_norm.weight"], sd["model.layers.1.self_attn.q_norm.weight"])
    np.testing.assert_array_equal(t["blk.0.attn_k_norm.weight"], sd["model.layers.0.self_attn.k_norm.weight"])


# --------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(models, hf_reference, name, chunk):
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=chunk)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
def test_llama4_chunks_matter(models, hf_reference, chunk):
    """The same file with chunks of 4096 (every position in one chunk) is far from transformers:
    the match above rests on the chunks."""
    _, _, path = models["llama4"]
    wide = _rewritten(path, path + ".wide.gguf", "llama4", uints={"attention.sliding_window": 4096})
    want = hf_reference.logits("llama4", PROMPT)
    got = hf_tiny.ember_logits(wide, PROMPT, chunk=chunk)
    assert np.abs(got - want).max() / np.abs(want).max() > 1e-2


def test_llama4_temperature_matters(models, hf_reference):
    _, _, path = models["llama4"]
    cold = _rewritten(path, path + ".cold.gguf", "llama4", floats={"attention.temperature_scale": 0.0})
    want = hf_reference.logits("llama4", PROMPT)
    got = hf_tiny.ember_logits(cold, PROMPT)
    assert np.abs(got - want).max() / np.abs(want).max() > 1e-3


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", MODELS)
def test_inside_an_engine_batch(models, hf_reference, name, device):
    """The reference prompt among other sequences of the engine's steps (chunked prefill beside other
    sequences' decodes: chunks, NoPE layers, the mixture and q/k norms over paged KV)."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, device, PROMPT)


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (chunked attention in each kernel, the mixture with weighted inputs,
    per-head norms) against the CPU, both with the f16 KV cache."""
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    path = models[name][2]
    want = hf_tiny.ember_logits(path, PROMPT, kv_type="f16")
    got = hf_tiny.ember_logits(path, PROMPT, n_gpu_layers=-1, kv_type="f16", chunk=chunk)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 2e-3, f"{name}: max|diff|/max|ref| = {rel:.2e}"


def test_greedy_text_matches_llama_cpp(models, tmp_path):
    """llama.cpp (llama-simple: CPU, greedy, f16 KV cache) loads the converted llama4 with the chunk and
    temperature llama.cpp fixes (tools/gen_llama4_greedy_reference.py); the bytes of its pieces are those
    of ember's greedy tokens. (llama.cpp reads Command R+'s q/k norms only in files of 64 layers or more.)"""

    ref = json.loads(GREEDY.read_text(encoding="utf-8"))["llama4"]
    path = _rewritten(models["llama4"][2], str(tmp_path / "fixed.gguf"), "llama4", **LLAMA_CPP_KEYS)
    got = hf_tiny.greedy_bytes(path, ref["prompt"], ref["n_predict"])
    assert got == bytes.fromhex(ref["text_hex"]), got


# --------------------------------------------------------------------------------------- errors


def _set(**changes):
    return lambda cfg: cfg.update(changes)


@pytest.mark.parametrize("name,edit,needles", [
    ("llama4", _set(no_rope_layers=[1, 0, 1, 1]), ["'no_rope_layers' must be [1, 1, 1, 0]"]),
    ("llama4", _set(layer_types=["chunked_attention"] * 4), ["'layer_types' must be"]),
    ("llama4", _set(moe_layers=[0, 2]), ["'moe_layers' [0, 2] is not every interleave_moe_layer_step=2-th layer"]),
    ("llama4", _set(use_qk_norm=False), ["use_qk_norm=False with 4 experts"]),
    ("llama4", _set(attention_chunk_size=0), ["'attention_chunk_size' must be a positive integer"]),
    ("llama4", _set(num_experts_per_tok=5), ["num_experts_per_tok=5 exceeds num_local_experts=4"]),
])
def test_bad_config_gives_clear_error(models, tmp_path, name, edit, needles):
    d = hf_tiny.edited(models[name][0], str(tmp_path / "m"), edit)
    out = str(tmp_path / "o.gguf")
    with pytest.raises(ConvertError) as e:
        convert(d, out, "f32", progress=False)
    assert not os.path.exists(out)
    msg = str(e.value)
    assert "config.json" in msg and "\n" not in msg
    for n in needles:
        assert n in msg, msg


def _rewritten(src, dst, arch, floats=None, uints=None, drop=()):
    """A copy of the GGUF at src with {arch}.<key> fields set (floats as f32, uints as u32) and the
    tensors named in drop left out."""
    floats, uints = floats or {}, uints or {}
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = name[len(arch) + 1:] if name.startswith(arch + ".") else None
        if key in floats or key in uints:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vtype)
    for key, value in floats.items():
        w.add_float32(f"{arch}.{key}", value)
    for key, value in uints.items():
        w.add_uint32(f"{arch}.{key}", value)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("name,arch,change,needle", [
    ("llama4", "llama4", dict(uints={"interleave_moe_layer_step": 1}), "layer 0 must have a mixture"),
    ("llama4", "llama4", dict(uints={"interleave_moe_layer_step": 0}), "interleave_moe_layer_step must be positive"),
    ("llama4", "llama4", dict(uints={"attention.temperature_length": 0}), "temperature_length must be positive"),
    ("command-r-plus", "command-r", dict(drop=("blk.0.attn_k_norm.weight",)), "need both blk.N.attn_q_norm"),
])
def test_bad_file_gives_clear_error(models, tmp_path, name, arch, change, needle):
    path = _rewritten(models[name][2], str(tmp_path / "bad.gguf"), arch, **change)
    with pytest.raises(ValueError, match=needle):
        _ember.Model(path)
