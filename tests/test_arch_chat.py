"""The chat families of issue 42 (Gemma 2, OLMo 2 / OLMo 3, Granite, SmolLM3): tiny random HF models
(tools/gen_hf_references.py says how each was made) converted by ember-convert; the GGUF keys and
tensors must be those llama.cpp's converter writes, ember's logits must match transformers' at f32
(prompts longer than every window; one batch, token by token and inside an engine batch),
llama.cpp's greedy text on the same files must be ember's, and configs ember cannot write give a
clear error."""
import json
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to read converted files")
pytest.importorskip("sentencepiece", reason="sentencepiece reads the SentencePiece tokenizer model")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402
from hf_tiny import hf_reference  # noqa: E402,F401 (a fixture)

from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

PROMPT = hf_tiny.LONG_PROMPT
MODELS = ["gemma2", "olmo2", "olmo3", "granite", "smollm3"]
GREEDY = hf_tiny.ROOT / "tests" / "reference" / "chat_families" / "llama_cpp_greedy.json"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    return hf_tiny.converted(tmp_path_factory, MODELS, "chat_models")


_fields = hf_tiny.gguf_fields
_tensors = hf_tiny.gguf_tensors


def _permuted(w, n_heads):
    """llama.cpp's Q/K row permutation (GGUF's llama rope layout)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ------------------------------------------------------------------------------------- metadata


def test_gemma2_file(models):
    _, sd, path = models["gemma2"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "gemma2"
    assert kv["gemma2.attn_logit_softcapping"] == pytest.approx(0.8)
    assert kv["gemma2.final_logit_softcapping"] == pytest.approx(1.0)
    assert kv["gemma2.attention.sliding_window"] == 8
    # HF's layer types (every other layer from the first slides) are llama.cpp's built-in period 2,
    # and query_pre_attn_scalar = head_dim its built-in scale: no keys for either.
    for absent in ("attention.sliding_window_pattern", "attention.scale", "rope.freq_base_swa"):
        assert f"gemma2.{absent}" not in kv
    assert "output.weight" not in t
    block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "post_attention_norm", "ffn_norm", "ffn_gate",
             "ffn_up", "ffn_down", "post_ffw_norm"]
    assert set(t) == {"token_embd.weight", "output_norm.weight"} | {f"blk.{i}.{n}.weight" for i in range(4)
                                                                    for n in block}
    np.testing.assert_array_equal(t["blk.1.post_ffw_norm.weight"],
                                  sd["model.layers.1.post_feedforward_layernorm.weight"] + np.float32(1))
    np.testing.assert_array_equal(t["blk.1.attn_q.weight"], sd["model.layers.1.self_attn.q_proj.weight"])


@pytest.mark.parametrize("name", ["olmo2", "olmo3"])
def test_olmo2_file(models, name):
    _, sd, path = models[name]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "olmo2"
    block = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "post_attention_norm",
             "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]
    n_layer = kv["olmo2.block_count"]
    assert set(t) == {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(n_layer) for n in block}
    # Full-width q/k norms, neox rope (rows in HF's order), post-norms as they are.
    assert t["blk.0.attn_q_norm.weight"].shape == (64,) and t["blk.0.attn_k_norm.weight"].shape == (32,)
    np.testing.assert_array_equal(t["blk.0.attn_k_norm.weight"], sd["model.layers.0.self_attn.k_norm.weight"])
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"], sd["model.layers.0.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(t["blk.0.post_ffw_norm.weight"],
                                  sd["model.layers.0.post_feedforward_layernorm.weight"])
    if name == "olmo2":
        assert "olmo2.attention.sliding_window" not in kv
    else:
        assert kv["olmo2.attention.sliding_window"] == 8
        assert list(kv["olmo2.attention.sliding_window_pattern"]) == [True, True, True, False]


def test_granite_file(models):
    _, sd, path = models["granite"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "granite"
    expect = {"attention.scale": 0.5, "embedding_scale": 4.0, "residual_scale": 0.5, "logit_scale": 2.5}
    for k, v in expect.items():
        assert kv[f"granite.{k}"] == pytest.approx(v), k
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"], _permuted(sd["model.layers.0.self_attn.q_proj.weight"], 4))


def test_smollm3_file(models):
    _, sd, path = models["smollm3"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "smollm3"
    # llama.cpp fixes the NoPE interval: no key.
    assert not any("rope_layer" in k for k in kv)
    np.testing.assert_array_equal(t["blk.3.attn_k.weight"], _permuted(sd["model.layers.3.self_attn.k_proj.weight"], 2))


# --------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(models, hf_reference, name, chunk):
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=chunk)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


def test_gemma2_caps_bend_the_logits(models, hf_reference):
    """The final soft-cap is visible: every logit lies within the cap, and the largest come close."""
    got = hf_tiny.ember_logits(models["gemma2"][2], PROMPT)
    assert np.abs(got).max() < 1.0 and np.abs(got).max() > 0.5


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", MODELS)
def test_inside_an_engine_batch(models, hf_reference, name, device):
    """The reference prompt among other sequences of the engine's steps (chunked prefill beside
    other sequences' decodes, windows, soft-caps and NoPE layers with paged KV): its prompt
    logprobs are transformers' (an f32 KV cache, on the CPU and on the GPU)."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, device, PROMPT)


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (soft-capped attention in each kernel, NoPE layers, full-width q/k
    norms, muP scales; one 40-token batch, or token by token through the decode kernels and
    graphs) against the CPU, both with the f16 KV cache."""
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    path = models[name][2]
    want = hf_tiny.ember_logits(path, PROMPT, kv_type="f16")
    got = hf_tiny.ember_logits(path, PROMPT, n_gpu_layers=-1, kv_type="f16", chunk=chunk)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 2e-3, f"{name}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_text_matches_llama_cpp(models, name):
    """llama.cpp (llama-simple: CPU, greedy, f16 KV cache) loads each converted file; the bytes of
    its n_predict pieces are those of ember's greedy tokens (tools/gen_chat_greedy_references.py)."""

    ref = json.loads(GREEDY.read_text(encoding="utf-8"))[name]
    got = hf_tiny.greedy_bytes(models[name][2], ref["prompt"], ref["n_predict"])
    assert got == bytes.fromhex(ref["text_hex"]), got


# --------------------------------------------------------------------------------------- errors


def _set(**changes):
    return lambda cfg: cfg.update(changes)


@pytest.mark.parametrize("name,edit,needles", [
    ("gemma2", _set(attn_logit_softcapping=None), ["'attn_logit_softcapping' must be a positive number"]),
    ("gemma2", _set(final_logit_softcapping=-1.0), ["'final_logit_softcapping' must be a positive number"]),
    ("gemma2", _set(tie_word_embeddings=False), ["tie_word_embeddings=false is not supported for gemma2"]),
    ("olmo3", _set(layer_types=["sliding_attention"] * 3), ["'layer_types' has 3 entries"]),
    ("granite", _set(logits_scaling=0), ["'logits_scaling' must be a positive number"]),
    ("granite", _set(use_sliding_window=True), ["sliding-window attention is not supported for granite"]),
    ("smollm3", _set(no_rope_layers=[1, 0, 1, 1]), ["no_rope_layers / no_rope_layer_interval differ"]),
    ("smollm3", _set(no_rope_layer_interval=3), ["each fourth"]),
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


def _rewritten(src, dst, arch, **changes):
    """A copy of the GGUF at src with {arch}.<key> fields set to the given floats."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = name[len(arch) + 1:] if name.startswith(arch + ".") else None
        if key in changes:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vtype)
    for key, value in changes.items():
        w.add_float32(f"{arch}.{key}", value)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("name,key,value,needle", [
    ("gemma2", "attn_logit_softcapping", -2.0, "gemma2.attn_logit_softcapping must be positive"),
    ("gemma2", "final_logit_softcapping", 0.0, "gemma2.final_logit_softcapping must be positive"),
    ("granite", "logit_scale", 0.0, "granite.logit_scale must not be 0"),
])
def test_bad_file_gives_clear_error(models, tmp_path, name, key, value, needle):
    path = _rewritten(models[name][2], str(tmp_path / "bad.gguf"), name, **{key: value})
    with pytest.raises(ValueError, match=needle):
        _ember.Model(path)
