"""ember-convert for Qwen3, Gemma 3 and rope scaling: tiny random HF models are converted; the
GGUF keys and tensors must be those llama.cpp's converter writes, ember's logits must match
transformers' (tests/reference/hf, or live with hf_live; prompts longer than the sliding window and
than the pre-scaling context), and configs the converter cannot express give a clear error."""
import json
import os
import shutil
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

# The tiny models (tools/gen_hf_references.py says how each was made): Qwen3 with its own head
# dimension; Gemma 3 with 7 layers and a window of 8, by default and with linear rope scaling
# and a layer pattern of period 3; Llama with llama 3, linear and YaRN rope scaling.
MODELS = ["qwen3", "gemma3", "gemma3-linear-period3", "llama-llama3", "llama-linear", "llama-yarn"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name in MODELS:
        d = str(root / name)
        weights = hf_tiny.build(name, d)
        path = str(root / f"{name}.gguf")
        convert(d, path, "f32", progress=False)
        out[name] = (d, weights, path)
    return out


def _fields(path):
    return {name: f.contents() for name, f in gguf.GGUFReader(path).fields.items()}


def _tensors(path):
    """GGUF name -> array in numpy (HF) order."""
    return {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)])
            for t in gguf.GGUFReader(path).tensors}


def _config(name):
    return hf_tiny.models()[name]["config"]


# ------------------------------------------------------------------------------------- metadata


def test_qwen3_file(models):
    hf_dir, sd, path = models["qwen3"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "qwen3"
    assert kv["qwen3.attention.key_length"] == 24 and kv["qwen3.attention.value_length"] == 24
    assert kv["qwen3.embedding_length"] == 64 and kv["qwen3.attention.head_count"] == 4
    assert kv["qwen3.attention.head_count_kv"] == 2 and kv["qwen3.block_count"] == 2
    assert kv["qwen3.rope.freq_base"] == pytest.approx(_config("qwen3")["rope_parameters"]["rope_theta"])
    assert not any(k.startswith("qwen3.rope.scaling") for k in kv)
    assert not any(n.endswith(".bias") for n in t)
    assert t["blk.0.attn_q.weight"].shape == (96, 64) and t["blk.0.attn_k.weight"].shape == (48, 64)
    for i in range(2):
        for hf, g in [("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")]:
            assert t[f"blk.{i}.{g}.weight"].shape == (24,)
            np.testing.assert_array_equal(t[f"blk.{i}.{g}.weight"], sd[f"model.layers.{i}.self_attn.{hf}.weight"])
        # NEOX rope: Q/K rows stay in HF's order.
        np.testing.assert_array_equal(t[f"blk.{i}.attn_q.weight"], sd[f"model.layers.{i}.self_attn.q_proj.weight"])
        np.testing.assert_array_equal(t[f"blk.{i}.attn_k.weight"], sd[f"model.layers.{i}.self_attn.k_proj.weight"])
    assert len(t) == 3 + 2 * 11


_GEMMA_BLOCK = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]
_GEMMA_HF = {"attn_norm": "input_layernorm", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
             "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
             "post_ffw_norm": "post_feedforward_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def test_gemma3_file(models):
    hf_dir, sd, path = models["gemma3"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "gemma3"
    expect = {"context_length": 128, "embedding_length": 64, "block_count": 7, "feed_forward_length": 160,
              "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
              "attention.value_length": 16, "attention.sliding_window": 8}
    for k, v in expect.items():
        assert kv[f"gemma3.{k}"] == v, k
    assert kv["gemma3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert kv["gemma3.rope.freq_base"] == pytest.approx(1e6)
    assert kv["gemma3.rope.freq_base_swa"] == pytest.approx(1e4)
    # HF's default layer types are llama.cpp's built-in pattern: no key; nor scaling or extra scale.
    for absent in ("attention.sliding_window_pattern", "rope.scaling.type", "attention.scale",
                   "final_logit_softcapping"):
        assert f"gemma3.{absent}" not in kv
    assert set(t) == {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(7) for n in _GEMMA_BLOCK}
    np.testing.assert_array_equal(t["token_embd.weight"], sd["model.embed_tokens.weight"])
    # Every norm is stored as 1 + w (Gemma's RMSNorm scales by 1 + w).
    np.testing.assert_allclose(t["output_norm.weight"], sd["model.norm.weight"] + 1, rtol=0, atol=0)
    for i in (0, 5):
        for g in _GEMMA_BLOCK:
            w = sd[f"model.layers.{i}.{_GEMMA_HF[g]}.weight"]
            np.testing.assert_array_equal(t[f"blk.{i}.{g}.weight"], w + np.float32(1) if g.endswith("norm") else w)
    assert kv["tokenizer.ggml.model"] == "llama"
    assert kv["tokenizer.ggml.add_bos_token"] is True
    assert kv["tokenizer.ggml.add_space_prefix"] is False
    assert len(kv["tokenizer.ggml.tokens"]) == _config("gemma3")["vocab_size"]


def test_gemma3_tokenizer(models, hf_reference):
    """Against transformers' SentencePiece-backed tokenizer of a model like Gemma's: no dummy
    prefix, and BOS asked for by tokenizer_config.json."""
    et = _ember.Tokenizer.from_gguf_file(models["gemma3"][2])
    for text in hf_tiny.TEST_TEXTS:
        want = hf_reference.encode("spm-nodummy", text, add_special_tokens=False, backend="sentencepiece")
        assert et.encode(text.encode("utf-8"), False, False) == want, repr(text)
        assert et.encode(text.encode("utf-8"), True, False) == [1] + want, repr(text)


def test_gemma3_linear_and_pattern_keys(models):
    kv = _fields(models["gemma3-linear-period3"][2])
    assert kv["gemma3.rope.scaling.type"] == "linear"
    assert kv["gemma3.rope.scaling.factor"] == pytest.approx(4.0)
    assert kv["gemma3.rope.freq_base"] == pytest.approx(1e5)
    assert kv["gemma3.rope.freq_base_swa"] == pytest.approx(1e4)
    assert kv["gemma3.attention.sliding_window_pattern"] == 3   # layer i local iff i % 3 < 2


def _edited(src, dst, edit):
    d = shutil.copytree(src, dst)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    edit(cfg)
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return d


def test_gemma3_irregular_layer_types_and_attention_scale(models, tmp_path):
    def edit(cfg):
        cfg["layer_types"] = ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]
        cfg["query_pre_attn_scalar"] = 64
        cfg["final_logit_softcapping"] = 30.0
    d = _edited(models["gemma3"][0], str(tmp_path / "m"), edit)
    out = str(tmp_path / "o.gguf")
    convert(d, out, "f32", progress=False)
    kv = _fields(out)
    # No period fits: one flag per layer, true where the layer uses the sliding window.
    assert kv["gemma3.attention.sliding_window_pattern"] == [False] + [True] * 5 + [False]
    assert kv["gemma3.attention.scale"] == pytest.approx(64 ** -0.5)
    assert kv["gemma3.final_logit_softcapping"] == pytest.approx(30.0)


def test_gemma3_multimodal_checkpoint_gives_the_text_model(models, tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint converts to the same file as its language
    model alone (the vision tower and projector are left out): the "gemma3" model's weights in the
    layout transformers saves for a Gemma3ForConditionalGeneration with a one-layer vision tower."""
    path = models["gemma3"][2]
    d = str(tmp_path / "mm")
    hf_tiny.build("gemma3-multimodal", d)
    out = str(tmp_path / "mm.gguf")
    convert(d, out, "f32", progress=False)
    want, got = _tensors(path), _tensors(out)
    assert set(got) == set(want)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n], err_msg=n)
    kv_want, kv_got = _fields(path), _fields(out)
    assert {k: v for k, v in kv_got.items() if k.startswith("gemma3.")} == \
        {k: v for k, v in kv_want.items() if k.startswith("gemma3.")}


def test_llama3_rope_freqs(models, hf_reference):
    """rope_freqs.weight[i] divides pair i's frequency: HF's unscaled / scaled inverse frequencies."""
    path = models["llama-llama3"][2]
    kv, t = _fields(path), _tensors(path)
    assert not any(k.startswith("llama.rope.scaling") for k in kv)
    assert gguf.GGUFReader(path).tensors[0].name == "rope_freqs.weight"
    got = t["rope_freqs.weight"]
    assert got.dtype == np.float32 and got.shape == (8,)
    plain = 1.0 / (10000.0 ** (np.arange(0, 16, 2, dtype=np.float64) / 16))
    scaled = hf_reference.inv_freq("llama-llama3").astype(np.float64)
    np.testing.assert_allclose(got, plain / scaled, rtol=1e-5)
    # The test's rope covers all three bands: kept, blended, and divided by the factor.
    assert got[0] == 1.0 and 1.0 < got[1] < 4.0 and got[-1] == 4.0


def test_linear_and_yarn_keys(models):
    kv = _fields(models["llama-linear"][2])
    assert kv["llama.rope.scaling.type"] == "linear"
    assert kv["llama.rope.scaling.factor"] == pytest.approx(2.0)
    kv = _fields(models["llama-yarn"][2])
    assert kv["llama.rope.scaling.type"] == "yarn"
    assert kv["llama.rope.scaling.factor"] == pytest.approx(4.0)
    assert kv["llama.rope.scaling.original_context_length"] == 32
    assert kv["llama.rope.scaling.yarn_beta_fast"] == pytest.approx(32.0)
    assert kv["llama.rope.scaling.yarn_beta_slow"] == pytest.approx(1.0)
    assert "llama.rope.scaling.yarn_attn_factor" not in kv   # not in the config: the runtime derives it
    assert "rope_freqs.weight" not in _tensors(models["llama-yarn"][2])


# --------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(models, hf_reference, name):
    path = models[name][2]
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(path, PROMPT)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (q/k norms, windows, scaled ropes, GeLU in the CUDA kernels; one
    40-token batch, or token by token through the decode kernels and graphs) against the CPU,
    both with the f16 KV cache."""
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    path = models[name][2]
    want = hf_tiny.ember_logits(path, PROMPT, kv_type="f16")
    got = hf_tiny.ember_logits(path, PROMPT, n_gpu_layers=-1, kv_type="f16", chunk=chunk)
    rel = np.abs(got - want).max() / np.abs(want).max()
    print(f"{name} chunk {chunk}: max|diff|/max|ref| = {rel:.2e}")
    assert rel <= 2e-3, f"{name}: max|diff|/max|ref| = {rel:.2e}"


# --------------------------------------------------------------------------------------- errors


def _convert_edited(models, tmp_path, name, edit):
    d = _edited(models[name][0], str(tmp_path / "m"), edit)
    out = str(tmp_path / "o.gguf")
    try:
        convert(d, out, "f32", progress=False)
    finally:
        assert not os.path.exists(out)


def _rope_edit(**changes):
    def edit(cfg):
        cfg["rope_parameters"] = {**cfg["rope_parameters"], **changes}
    return edit


def _drop_rope_key(key):
    def edit(cfg):
        del cfg["rope_parameters"][key]
    return edit


@pytest.mark.parametrize("name,edit,needles", [
    ("llama-linear", _rope_edit(rope_type="dynamic"), ["unsupported rope scaling 'dynamic'", "linear, yarn, llama3"]),
    ("qwen3", _rope_edit(rope_type="longrope", factor=2.0), ["unsupported rope scaling 'longrope'"]),
    ("qwen3", _rope_edit(rope_type="llama3"), ["unsupported rope scaling 'llama3'"]),
    ("llama-llama3", _drop_rope_key("low_freq_factor"), ["'llama3'", "missing 'low_freq_factor'"]),
    ("llama-llama3", _drop_rope_key("original_max_position_embeddings"),
     ["missing 'original_max_position_embeddings'"]),
    ("llama-linear", _drop_rope_key("factor"), ["'linear'", "missing 'factor'"]),
    ("llama-yarn", _drop_rope_key("original_max_position_embeddings"),
     ["'yarn'", "missing 'original_max_position_embeddings'"]),
    ("llama-yarn", _rope_edit(mscale_all_dim=1.0), ["'mscale_all_dim'"]),
    ("llama-linear", _rope_edit(factor="two"), ["non-numeric 'factor'"]),
    ("qwen3", lambda c: c.pop("num_attention_heads"), ["missing key 'num_attention_heads'"]),
    ("qwen3", lambda c: c.update(head_dim=None, hidden_size=None), ["missing key 'hidden_size'"]),
    ("qwen3", lambda c: c.update(use_sliding_window=True, sliding_window=16), ["sliding-window", "qwen3"]),
    ("qwen3", lambda c: c.update(attention_bias=True), ["attention_bias"]),
    ("gemma3", lambda c: c.pop("num_hidden_layers"), ["missing key 'num_hidden_layers'"]),
    ("gemma3", lambda c: c.update(attn_logit_softcapping=50.0), ["attn_logit_softcapping"]),
    ("gemma3", lambda c: c.update(hidden_activation="silu"), ["'silu'", "gelu_pytorch_tanh"]),
    ("gemma3", lambda c: c.update(layer_types=["sliding_attention"] * 6), ["'layer_types' has 6 entries"]),
    ("gemma3", lambda c: c["rope_parameters"]["sliding_attention"].update(rope_type="linear", factor=2.0),
     ["sliding-window layers", "'linear'"]),
    ("gemma3", lambda c: c["rope_parameters"]["full_attention"].update(rope_type="yarn", factor=2.0,
                                                                        original_max_position_embeddings=64),
     ["unsupported rope scaling 'yarn'"]),
    ("gemma3", lambda c: c.update(tie_word_embeddings=False), ["tie_word_embeddings"]),
])
def test_bad_config_gives_clear_error(models, tmp_path, name, edit, needles):
    with pytest.raises(ConvertError) as e:
        _convert_edited(models, tmp_path, name, edit)
    msg = str(e.value)
    assert "config.json" in msg and "\n" not in msg
    for n in needles:
        assert n in msg, msg


def test_multimodal_without_text_config(models, tmp_path):
    def edit(cfg):
        cfg["architectures"] = ["Gemma3ForConditionalGeneration"]
    with pytest.raises(ConvertError, match="without a 'text_config'"):
        _convert_edited(models, tmp_path, "gemma3", edit)
