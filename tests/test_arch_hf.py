"""ember-convert for Qwen3, Gemma 3, rope scaling and the mixtures (Qwen3-MoE, Mixtral, gpt-oss):
tiny random HF models are converted; the GGUF keys and tensors must be those llama.cpp's converter
writes, ember's logits must match transformers' (tests/reference/hf, or live with hf_live; prompts
longer than the sliding window and than the pre-scaling context; as one batch, token by token and
inside an engine batch), and configs or files ember cannot take give a clear error."""
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
# and a layer pattern of period 3; Llama with llama 3, linear and YaRN rope scaling; the mixtures
# with 8 experts: Qwen3-MoE (top 2 renormalized, and top 3 not), Mixtral, gpt-oss (bf16, 4 layers
# alternating a window of 8 with full attention, YaRN from a context of 32).
MOE_MODELS = ["qwen3moe", "qwen3moe-unnormed", "mixtral", "gpt-oss"]
MODELS = ["qwen3", "gemma3", "gemma3-linear-period3", "llama-llama3", "llama-linear", "llama-yarn", *MOE_MODELS]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    return hf_tiny.converted(tmp_path_factory, MODELS, "models")


_fields = hf_tiny.gguf_fields
_tensors = hf_tiny.gguf_tensors


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


def test_gemma3_irregular_layer_types_and_attention_scale(models, tmp_path):
    def edit(cfg):
        cfg["layer_types"] = ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]
        cfg["query_pre_attn_scalar"] = 64
        cfg["final_logit_softcapping"] = 30.0
    d = hf_tiny.edited(models["gemma3"][0], str(tmp_path / "m"), edit)
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
    d = hf_tiny.edited(models[name][0], str(tmp_path / "m"), edit)
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


# ------------------------------------------------------------------------------------- mixtures


def _types(path):
    return {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}


def _stacked(sd, layer, template, n):
    return np.stack([sd[f"model.layers.{layer}.{template.format(e=e)}.weight"] for e in range(n)])


@pytest.mark.parametrize("name,norm", [("qwen3moe", None), ("qwen3moe-unnormed", False)])
def test_qwen3moe_file(models, name, norm):
    _, sd, path = models[name]
    kv, t, types = _fields(path), _tensors(path), _types(path)
    cfg = _config(name)
    assert kv["general.architecture"] == "qwen3moe"
    assert kv["qwen3moe.expert_count"] == 8
    assert kv["qwen3moe.expert_used_count"] == cfg["num_experts_per_tok"]
    assert kv["qwen3moe.expert_feed_forward_length"] == cfg["moe_intermediate_size"]
    assert kv.get("qwen3moe.expert_weights_norm") is norm
    F = cfg["moe_intermediate_size"]
    for i in range(2):
        for kind, hf in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            got = t[f"blk.{i}.ffn_{kind}_exps.weight"]
            assert got.shape == ((8, 64, F) if kind == "down" else (8, F, 64))
            np.testing.assert_array_equal(got, _stacked(sd, i, "mlp.experts.{e}." + hf, 8))
        np.testing.assert_array_equal(t[f"blk.{i}.ffn_gate_inp.weight"], sd[f"model.layers.{i}.mlp.gate.weight"])
        assert f"blk.{i}.ffn_gate.weight" not in t
        assert types[f"blk.{i}.ffn_gate_inp.weight"] == gguf.GGMLQuantizationType.F32
    assert len(t) == 3 + 2 * 12


def test_mixtral_file(models):
    _, sd, path = models["mixtral"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "llama"
    assert kv["llama.expert_count"] == 8 and kv["llama.expert_used_count"] == 2
    assert kv["llama.feed_forward_length"] == 48 and "llama.expert_feed_forward_length" not in kv
    for i in range(2):
        for kind, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            np.testing.assert_array_equal(t[f"blk.{i}.ffn_{kind}_exps.weight"],
                                          _stacked(sd, i, "block_sparse_moe.experts.{e}." + w, 8))
        np.testing.assert_array_equal(t[f"blk.{i}.ffn_gate_inp.weight"],
                                      sd[f"model.layers.{i}.block_sparse_moe.gate.weight"])
    assert len(t) == 3 + 2 * 10


def test_gpt_oss_file(models):
    _, sd, path = models["gpt-oss"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "gpt-oss"
    expect = {"block_count": 4, "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 48,
              "feed_forward_length": 48, "attention.sliding_window": 8, "attention.key_length": 16,
              "rope.scaling.type": "yarn", "rope.scaling.original_context_length": 32}
    for k, v in expect.items():
        assert kv[f"gpt-oss.{k}"] == v, k
    assert kv["gpt-oss.rope.scaling.factor"] == pytest.approx(4.0)
    assert kv["gpt-oss.rope.freq_base"] == pytest.approx(150000.0)
    for i in range(4):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        gate_up, bias = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.gate_up_proj_bias"]
        # gate and up are the even and odd columns of x @ gate_up_proj; GGUF stores [out][in] rows.
        np.testing.assert_array_equal(t[g + "ffn_gate_exps.weight"], gate_up[:, :, 0::2].transpose(0, 2, 1))
        np.testing.assert_array_equal(t[g + "ffn_up_exps.weight"], gate_up[:, :, 1::2].transpose(0, 2, 1))
        np.testing.assert_array_equal(t[g + "ffn_gate_exps.bias"], bias[:, 0::2])
        np.testing.assert_array_equal(t[g + "ffn_up_exps.bias"], bias[:, 1::2])
        np.testing.assert_array_equal(t[g + "ffn_down_exps.weight"],
                                      sd[p + "mlp.experts.down_proj"].transpose(0, 2, 1))
        np.testing.assert_array_equal(t[g + "ffn_down_exps.bias"], sd[p + "mlp.experts.down_proj_bias"])
        np.testing.assert_array_equal(t[g + "ffn_gate_inp.bias"], sd[p + "mlp.router.bias"])
        np.testing.assert_array_equal(t[g + "attn_sinks.weight"], sd[p + "self_attn.sinks"])
        np.testing.assert_array_equal(t[g + "attn_output.bias"], sd[p + "self_attn.o_proj.bias"])
        np.testing.assert_array_equal(t[g + "post_attention_norm.weight"], sd[p + "post_attention_layernorm.weight"])
        assert g + "ffn_norm.weight" not in t
    assert len(t) == 3 + 4 * 19


def test_moe_biases_and_routers_stay_f32(models, tmp_path):
    """As llama.cpp's converter: at --outtype f16 the experts are F16, their biases, the routers and
    the sinks F32."""
    out = str(tmp_path / "f16.gguf")
    convert(models["gpt-oss"][0], out, "f16", progress=False)
    types = _types(out)
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert types["blk.0.ffn_gate_exps.weight"] == F16 and types["blk.0.attn_q.weight"] == F16
    for n in ("ffn_gate_exps.bias", "ffn_down_exps.bias", "ffn_gate_inp.weight", "ffn_gate_inp.bias",
              "attn_sinks.weight", "attn_output.bias"):
        assert types[f"blk.0.{n}"] == F32, n


@pytest.mark.parametrize("name", MOE_MODELS)
def test_mixture_logits_token_by_token(models, hf_reference, name):
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=1)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", MOE_MODELS)
def test_mixture_inside_an_engine_batch(models, hf_reference, name, device):
    """The mixtures among other sequences of the engine's steps (hf_tiny.check_inside_an_engine_batch)."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, device, PROMPT)


@pytest.mark.parametrize("name,drop,fields,needles", [
    ("qwen3moe", (), {"qwen3moe.expert_used_count": 9}, ["qwen3moe.expert_used_count 9", "between 1 and"]),
    ("mixtral", (), {"llama.expert_used_count": 0}, ["llama.expert_used_count 0"]),
    ("gpt-oss", (), {"gpt-oss.expert_feed_forward_length": 40}, ["ffn_gate_exps.weight", "has shape"]),
    ("qwen3moe", ("blk.1.ffn_up_exps.weight",), {}, ["blk.1.ffn_up_exps.weight"]),
    ("gpt-oss", ("blk.0.ffn_down_exps.bias",), {}, ["blk.0.ffn_down_exps.bias"]),
    ("gpt-oss", ("blk.2.attn_sinks.weight",), {}, ["blk.2.attn_sinks.weight"]),
    ("qwen3", (), {"qwen3.expert_count": 8, "qwen3.expert_used_count": 2}, ["qwen3.expert_count", "no mixture"]),
])
def test_bad_mixture_file_gives_clear_error(models, tmp_path, name, drop, fields, needles):
    bad = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(models[name][2], bad, drop, fields)
    with pytest.raises(ValueError) as e:
        _ember.Model(bad)
    msg = str(e.value)
    assert "bad.gguf" in msg
    for n in needles:
        assert n in msg, msg


def test_qwen3moe_without_expert_count(models, tmp_path):
    src = models["qwen3moe"][2]
    bad = str(tmp_path / "bad.gguf")
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(bad, arch="qwen3moe")
    for f in reader.fields.values():
        if not f.name.startswith(("GGUF.", "general.architecture", "qwen3moe.expert_")):
            writer.add_key_value(f.name, f.contents(), f.types[0],
                                 f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="qwen3moe needs qwen3moe.expert_count"):
        _ember.Model(bad)


@pytest.mark.parametrize("name,edit,needles", [
    ("qwen3moe", lambda c: c.update(num_experts_per_tok=9), ["num_experts_per_tok=9", "(8)"]),
    ("mixtral", lambda c: c.update(num_experts_per_tok=9), ["num_experts_per_tok=9"]),
    ("qwen3moe", lambda c: c.update(mlp_only_layers=[1]), ["mlp_only_layers"]),
    ("mixtral", lambda c: c.pop("num_local_experts"), ["missing key 'num_local_experts'"]),
    ("gpt-oss", lambda c: c.update(swiglu_limit=10.0), ["swiglu_limit"]),
    ("gpt-oss", lambda c: c.update(quantization_config={"quant_method": "mxfp4"}), ["mxfp4-quantized"]),
    ("gpt-oss", lambda c: c.update(layer_types=["full_attention"] * 4), ["layer_types"]),
    ("gpt-oss", _rope_edit(truncate=True), ["truncate=false"]),
    ("gpt-oss", lambda c: c.pop("sliding_window"), ["missing key 'sliding_window'"]),
])
def test_bad_mixture_config_gives_clear_error(models, tmp_path, name, edit, needles):
    with pytest.raises(ConvertError) as e:
        _convert_edited(models, tmp_path, name, edit)
    msg = str(e.value)
    assert "config.json" in msg and "\n" not in msg
    for n in needles:
        assert n in msg, msg


def test_missing_expert_in_checkpoint_is_named(models, tmp_path):
    d = shutil.copytree(models["mixtral"][0], str(tmp_path / "m"))
    w = hf_tiny.build("mixtral", str(tmp_path / "full"))
    del w["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
    hf_tiny._write_safetensors(os.path.join(d, "model.safetensors"), w, "float32")
    with pytest.raises(ConvertError, match=r"missing tensor model\.layers\.1\.block_sparse_moe\.experts\.5\.w3"):
        convert(d, str(tmp_path / "o.gguf"), "f32", progress=False)
