"""Gemma 4 (dense): tiny random HF Gemma4ForCausalLM models (tools/gen_hf_references.py: sliding and
global layers of their own head size and KV heads, the last two layers reading earlier layers' KV,
layer scalars; "gemma4" with per-layer embeddings, values from the keys' projection and capped logits,
"gemma4-wide" with the KV-sharing layers' feed-forwards twice as wide) converted by ember-convert. The GGUF keys and
tensors must be those llama.cpp's converter writes; ember's logits must match transformers' at f32
(a prompt past the window; one batch, token by token and inside an engine batch); configs and files
ember cannot run give a clear error."""
import copy
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
SLIDING = [True, False] * 3


MODELS = ["gemma4", "gemma4-wide"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    return hf_tiny.converted(tmp_path_factory, MODELS, "gemma4_models")


@pytest.fixture(scope="module")
def model(models):
    return models["gemma4"]


def test_file_has_llama_cpp_keys_and_tensors(model):
    _, sd, path = model
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert kv["general.architecture"] == "gemma4"
    expect = {"attention.key_length": 32, "attention.key_length_swa": 16, "attention.value_length_swa": 16,
              "rope.dimension_count": 32, "rope.dimension_count_swa": 16, "attention.shared_kv_layers": 2,
              "embedding_length_per_layer_input": 8, "attention.sliding_window": 8}
    for k, v in expect.items():
        assert kv[f"gemma4.{k}"] == v, k
    assert kv["gemma4.final_logit_softcapping"] == pytest.approx(1.0)
    assert kv["gemma4.rope.freq_base"] == pytest.approx(1e6) and kv["gemma4.rope.freq_base_swa"] == pytest.approx(1e4)
    assert list(kv["gemma4.attention.sliding_window_pattern"]) == SLIDING
    assert list(kv["gemma4.attention.head_count_kv"]) == [2, 1] * 3
    # The global layers rotate a quarter of their 32 dimensions: 4 pairs, the other 12 divided by 1e30.
    np.testing.assert_array_equal(t["rope_freqs.weight"], np.array([1.0] * 4 + [1e30] * 12, np.float32))
    assert t["per_layer_token_embd.weight"].shape == (400, 48)
    assert t["per_layer_model_proj.weight"].shape == (48, 64)
    for i in range(6):
        own_kv, global_layer = i < 4, not SLIDING[i]
        assert (f"blk.{i}.attn_k.weight" in t) == own_kv and (f"blk.{i}.attn_k_norm.weight" in t) == own_kv
        # attention_k_eq_v: the global layers' values are their keys' projection.
        assert (f"blk.{i}.attn_v.weight" in t) == (own_kv and not global_layer)
        assert t[f"blk.{i}.attn_q.weight"].shape == ((128 if global_layer else 64), 64)
        np.testing.assert_array_equal(t[f"blk.{i}.layer_output_scale.weight"], sd[f"model.layers.{i}.layer_scalar"])
    assert t["blk.1.attn_k.weight"].shape == (32, 64)
    # Norms as stored (no 1 + w), rows in HF's order (neox rope).
    np.testing.assert_array_equal(t["blk.2.post_ffw_norm.weight"],
                                  sd["model.layers.2.post_feedforward_layernorm.weight"])
    np.testing.assert_array_equal(t["blk.3.attn_q.weight"], sd["model.layers.3.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(t["blk.5.inp_gate.weight"], sd["model.layers.5.per_layer_input_gate.weight"])
    assert "output.weight" not in t


def test_wide_file_has_per_layer_feed_forward_widths(models):
    _, sd, path = models["gemma4-wide"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert list(kv["gemma4.feed_forward_length"]) == [96, 96, 96, 192, 192]
    assert kv["gemma4.attention.head_count_kv"] == 2 and kv["gemma4.embedding_length_per_layer_input"] == 0
    assert "gemma4.final_logit_softcapping" not in kv and not any(n.startswith("per_layer") for n in t)
    assert t["blk.4.ffn_down.weight"].shape == (64, 192)
    np.testing.assert_array_equal(t["blk.2.attn_v.weight"], sd["model.layers.2.self_attn.v_proj.weight"])
    assert "blk.3.attn_k.weight" not in t and "blk.4.attn_v.weight" not in t


@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(models, hf_reference, name, chunk):
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=chunk)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", MODELS)
def test_inside_an_engine_batch(models, hf_reference, name, device):
    """The reference prompt among other sequences of the engine's steps: paged KV of two sizes, layers
    reading other layers' KV and per-layer embeddings of a batch of several sequences."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, device, PROMPT)


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """A prompt's attention on the GPU rounds its queries and probabilities to f16 as well. These tiny
    Gemma 4s are that sensitive to f16 rounding: the f16 KV cache alone moves the CPU's logits by 2.8e-2
    ("gemma4") and 4.8e-3 ("gemma4-wide") of their largest against an f32 cache, so the prompt's bound
    is 5e-3; token by token, 2e-3 as the other architectures."""
    hf_tiny.check_cuda_logits_match_cpu(models[name][2], PROMPT, chunk, 5e-3 if chunk > 1 else 2e-3)


def build_global_heads(out_dir, head_dim):
    """The "gemma4" model with global heads of head_dim (the 31B's are 512, the committed model's 32): its
    config and global layers' tensors resized, weights drawn as hf_tiny draws them (no transformers
    reference holds this one; the O projections scaled so the layers' outputs keep their size). Returns
    the path of its f32 GGUF."""
    spec = copy.deepcopy(hf_tiny.models()["gemma4"])
    config, shapes = spec["config"], spec["tensors"]
    n_head = config["num_attention_heads"]
    for i, entry in config["per_layer_config"].items():
        entry["head_dim"] = head_dim
        attn = f"model.layers.{i}.self_attn."
        shapes[attn + "q_proj.weight"] = [n_head * head_dim, config["hidden_size"]]
        shapes[attn + "o_proj.weight"] = [config["hidden_size"], n_head * head_dim]
        shapes[attn + "q_norm.weight"] = [head_dim]
        if attn + "k_proj.weight" in shapes:   # (the KV-sharing layers have none)
            shapes[attn + "k_proj.weight"] = [entry["num_key_value_heads"] * head_dim, config["hidden_size"]]
            shapes[attn + "k_norm.weight"] = [head_dim]
    hf_dir = os.path.join(out_dir, "hf")
    hf_tiny.copy_tokenizer(spec["tokenizer"], hf_dir)
    with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    weights = hf_tiny._draw(spec)
    for i in config["per_layer_config"]:
        weights[f"model.layers.{i}.self_attn.o_proj.weight"] *= np.float32(np.sqrt(32 / head_dim))
    hf_tiny._write_safetensors(os.path.join(hf_dir, "model.safetensors"), weights, spec["dtype"])
    path = os.path.join(out_dir, "global_heads.gguf")
    convert(hf_dir, path, "f32", progress=False)
    return path


@pytest.fixture(scope="module")
def global_heads_512(tmp_path_factory):
    return build_global_heads(str(tmp_path_factory.mktemp("gemma4_global_512")), 512)


def test_global_heads_of_512_on_the_cpu(global_heads_512):
    """Gemma 4's global heads of 512 in the file, and on the CPU the prompt in one batch gives the
    logits of the tokens one by one."""
    kv = hf_tiny.gguf_fields(global_heads_512)
    assert kv["gemma4.attention.key_length"] == 512 and kv["gemma4.attention.key_length_swa"] == 16
    batch = hf_tiny.ember_logits(global_heads_512, PROMPT, kv_type="f16", chunk=40)
    one_by_one = hf_tiny.ember_logits(global_heads_512, PROMPT, kv_type="f16", chunk=1)
    assert np.all(np.isfinite(batch))
    rel = np.abs(one_by_one - batch).max() / np.abs(batch).max()
    assert rel <= 1e-4, f"max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
def test_cuda_global_heads_of_512_match_cpu(global_heads_512, chunk):
    """The global layers' attention over heads of 512 on the GPU (the tiled kernel's wide form) against the
    CPU, with the sliding layers' heads of 16 beside them, both with the f16 cache. This random model is
    ill-conditioned: on the CPU the f16 cache alone moves its logits by 1.0e-1 of the largest against f32, and
    the GPU's kernels, which round q and the probabilities to f16 too, land within 1e-2 of the CPU's (the
    kernel itself is held to the suite's bounds by test_backend_ops' hd512 cases)."""
    hf_tiny.check_cuda_logits_match_cpu(global_heads_512, PROMPT, chunk, 2e-2)


def test_shared_layers_keep_no_kv(model):
    """The two layers reading earlier layers' KV take no KV memory: a block of 16 tokens holds the four
    others' K and V (two sliding layers of 2 heads of 16, two global of 1 head of 32) in f32, 16 KiB,
    so 1 MiB of KV is 64 blocks."""
    engine = _ember.Engine(_ember.Model(model[2]), n_ctx=64, max_num_seqs=1, n_threads=1, type_k="f32",
                           type_v="f32", kv_block_size=16, kv_mb=1.0)
    try:
        assert engine.stats()["kv_blocks_total"] == 64
    finally:
        engine.close()


def test_multimodal_checkpoint_converts_to_the_text_model(model, tmp_path):
    """Gemma 4 as released: Gemma4ForConditionalGeneration, the language model under
    model.language_model. beside vision and audio towers (left out): the text model's file."""
    src, sd, path = model
    d = shutil.copytree(src, str(tmp_path / "mm"))
    with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
        text = json.load(f)
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
              "vision_config": {"hidden_size": 16}, "audio_config": {"hidden_size": 16}}
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    rng = np.random.default_rng()
    weights = {"model.language_model." + k[len("model."):]: v for k, v in sd.items()}
    for name in ("model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight",
                 "model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight",
                 "model.embed_vision.embedding_projection.weight", "model.embed_audio.embedding_projection.weight"):
        weights[name] = rng.standard_normal((4, 16)).astype(np.float32)
    hf_tiny._write_safetensors(os.path.join(d, "model.safetensors"), weights, "float32")
    out = str(tmp_path / "mm.gguf")
    convert(d, out, "f32", progress=False)
    want, got = hf_tiny.gguf_tensors(path), hf_tiny.gguf_tensors(out)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    kv_want, kv_got = hf_tiny.gguf_fields(path), hf_tiny.gguf_fields(out)
    assert {k: v for k, v in kv_got.items() if k.startswith("gemma4.")} == \
        {k: v for k, v in kv_want.items() if k.startswith("gemma4.")}


# --------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("changes,needle", [
    (dict(enable_moe_block=True), "'num_experts' must be a positive integer, got None"),
    (dict(num_kv_shared_layers=6), "'num_kv_shared_layers' must be in [0, 6)"),
    (dict(vocab_size_per_layer_input=300), "vocab_size_per_layer_input=300 must equal vocab_size=400"),
    (dict(layer_types=["sliding_attention"] * 5), "'layer_types' must list num_hidden_layers=6"),
])
def test_bad_config_gives_clear_error(model, tmp_path, changes, needle):
    d = hf_tiny.edited(model[0], str(tmp_path / "m"), changes)
    out = str(tmp_path / "o.gguf")
    with pytest.raises(ConvertError) as e:
        convert(d, out, "f32", progress=False)
    assert not os.path.exists(out)
    assert "config.json" in str(e.value) and needle in str(e.value), str(e.value)


def test_missing_tensor_is_named(model, tmp_path):
    """A checkpoint without a global layer's k_norm, and a GGUF without per_layer_proj_norm, name it."""
    d = shutil.copytree(model[0], str(tmp_path / "m"))
    weights = {k: v for k, v in model[1].items() if k != "model.layers.3.self_attn.k_norm.weight"}
    hf_tiny._write_safetensors(os.path.join(d, "model.safetensors"), weights, "float32")
    with pytest.raises(ConvertError, match=r"missing tensor model\.layers\.3\.self_attn\.k_norm\.weight"):
        convert(d, str(tmp_path / "o.gguf"), "f32", progress=False)

    r = gguf.GGUFReader(model[2])
    path = str(tmp_path / "bad.gguf")
    w = gguf.GGUFWriter(path, "gemma4")
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    for t in r.tensors:
        if t.name != "per_layer_proj_norm.weight":
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="per_layer_proj_norm.weight"):
        _ember.Model(path)
