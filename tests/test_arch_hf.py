"""ember-convert for Qwen3, Gemma 3 and rope scaling: tiny random HF models are converted; the
GGUF keys and tensors must be those llama.cpp's converter writes, ember's logits must match
transformers' (prompts longer than the sliding window and than the pre-scaling context), and
configs the converter cannot express give a clear error."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to read converted files")
pytest.importorskip("torch", reason="torch is needed to run the transformers reference")
pytest.importorskip("transformers", reason="transformers builds the reference models")
pytest.importorskip("sentencepiece", reason="sentencepiece trains the SentencePiece tokenizer")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402

from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

# 40 tokens: past Gemma's window (8) and the rope-scaled models' original context (32).
PROMPT = [1] + [(37 * i + 11) % 250 + 3 for i in range(39)]

_LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
_GEMMA_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}

# name -> (arch, tokenizer kind, tied, config overrides)
MODELS = {
    "qwen3": ("qwen3", "bpe", False, dict(head_dim=24)),
    "gemma3": ("gemma3", "spm", True, dict(num_hidden_layers=7, sliding_window=8)),
    "gemma3-linear-period3": ("gemma3", "spm", True, dict(
        num_hidden_layers=7, sliding_window=8, layer_types=["sliding_attention", "sliding_attention",
                                                            "full_attention"] * 2 + ["sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 4.0},
                         **_GEMMA_ROPE})),
    "llama-llama3": ("llama", "bpe", False, dict(rope_parameters=_LLAMA3)),
    "llama-linear": ("llama", "bpe", False, dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                                  "factor": 2.0})),
    "llama-yarn": ("llama", "bpe", False, dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0})),
}


@pytest.fixture(scope="module")
def tokenizers_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    bpe = hf_tiny.bpe_tokenizer(str(root / "bpe"))
    # Like Gemma's tokenizer: a SentencePiece model that adds no dummy prefix, and a
    # tokenizer_config.json asking for BOS.
    spm_dir = str(root / "spm")
    _, reference = hf_tiny.spm_tokenizer(spm_dir, add_dummy_prefix=False)
    os.remove(os.path.join(spm_dir, "tokenizer.json"))
    with open(os.path.join(spm_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>"}, f)
    return {"bpe": (str(root / "bpe"), len(bpe), bpe), "spm": (str(root / "spm"), reference.vocab_size, reference)}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizers_dir):
    """name -> (HF dir, float32 reference model, path of its f32 GGUF)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for seed, (name, (arch, tok, tied, overrides)) in enumerate(MODELS.items()):
        d = shutil.copytree(tokenizers_dir[tok][0], str(root / name), dirs_exist_ok=True)
        ref = hf_tiny.tiny_model(d, arch, tokenizers_dir[tok][1], tied=tied, seed=seed, **overrides)
        path = str(root / f"{name}.gguf")
        convert(d, path, "f32", progress=False)
        out[name] = (d, ref, path)
    return out


def _fields(path):
    return {name: f.contents() for name, f in gguf.GGUFReader(path).fields.items()}


def _tensors(path):
    """GGUF name -> array in numpy (HF) order."""
    return {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)])
            for t in gguf.GGUFReader(path).tensors}


def _state(ref):
    return {k: v.numpy() for k, v in ref.state_dict().items()}


# ------------------------------------------------------------------------------------- metadata


def test_qwen3_file(models):
    hf_dir, ref, path = models["qwen3"]
    kv, t, sd = _fields(path), _tensors(path), _state(ref)
    assert kv["general.architecture"] == "qwen3"
    assert kv["qwen3.attention.key_length"] == 24 and kv["qwen3.attention.value_length"] == 24
    assert kv["qwen3.embedding_length"] == 64 and kv["qwen3.attention.head_count"] == 4
    assert kv["qwen3.attention.head_count_kv"] == 2 and kv["qwen3.block_count"] == 2
    assert kv["qwen3.rope.freq_base"] == pytest.approx(ref.config.rope_parameters["rope_theta"])
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


def test_gemma3_file(models, tokenizers_dir):
    hf_dir, ref, path = models["gemma3"]
    kv, t, sd = _fields(path), _tensors(path), _state(ref)
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
    assert len(kv["tokenizer.ggml.tokens"]) == ref.config.vocab_size


def test_gemma3_tokenizer(models, tokenizers_dir):
    reference = tokenizers_dir["spm"][2]
    et = _ember.Tokenizer.from_gguf_file(models["gemma3"][2])
    for text in hf_tiny.TEST_TEXTS:
        want = reference.encode(text, add_special_tokens=False)
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
    model alone (the vision tower and projector are left out)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    hf_dir, ref, path = models["gemma3"]
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    mm = Gemma3ForConditionalGeneration(Gemma3Config(text_config=ref.config.to_dict(), vision_config=vision,
                                                     mm_tokens_per_image=4))
    mm.model.language_model.load_state_dict(ref.model.state_dict())
    d = shutil.copytree(hf_dir, str(tmp_path / "mm"))
    for n in os.listdir(d):
        if n.endswith(".safetensors") or n == "config.json":
            os.remove(os.path.join(d, n))
    mm.save_pretrained(d)
    out = str(tmp_path / "mm.gguf")
    convert(d, out, "f32", progress=False)
    want, got = _tensors(path), _tensors(out)
    assert set(got) == set(want)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n], err_msg=n)
    kv_want, kv_got = _fields(path), _fields(out)
    assert {k: v for k, v in kv_got.items() if k.startswith("gemma3.")} == \
        {k: v for k, v in kv_want.items() if k.startswith("gemma3.")}


def test_llama3_rope_freqs(models):
    """rope_freqs.weight[i] divides pair i's frequency: HF's unscaled / scaled inverse frequencies."""
    _, ref, path = models["llama-llama3"]
    kv, t = _fields(path), _tensors(path)
    assert not any(k.startswith("llama.rope.scaling") for k in kv)
    assert gguf.GGUFReader(path).tensors[0].name == "rope_freqs.weight"
    got = t["rope_freqs.weight"]
    assert got.dtype == np.float32 and got.shape == (8,)
    plain = 1.0 / (10000.0 ** (np.arange(0, 16, 2, dtype=np.float64) / 16))
    scaled = ref.model.rotary_emb.inv_freq.double().numpy()
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


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_transformers(models, name):
    _, ref, path = models[name]
    want = hf_tiny.hf_logits(ref, PROMPT)
    got = hf_tiny.ember_logits(path, PROMPT)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", list(MODELS))
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
