"""The families of issue 42 with fused tensors, partial rotary or rope options of their own (Phi-3 /
Phi-4, Mistral 3's YaRN and attention temperature, GLM-4, Command R and cohere2): tiny random HF
models (tools/gen_hf_references.py says how each was made) converted by ember-convert; the GGUF keys
and tensors must be those llama.cpp's converter writes, ember's logits must match transformers' at
f32 (one batch and token by token, prompts longer than the window), and bad configs and files give a
clear error."""
import json
import os
import shutil
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

# name -> (prompt, n_ctx): past the original context of 32 the long LongRoPE factors rotate, within
# it the short ones, as transformers picks them by the sequence's length and llama.cpp by n_ctx.
CASES = {"phi3": (hf_tiny.LONG_PROMPT, 64), "phi3-short": (hf_tiny.SHORT_PROMPT, 32),
         "ministral3": (hf_tiny.LONG_PROMPT, 64), "glm4": (hf_tiny.LONG_PROMPT, 64),
         "command-r": (hf_tiny.LONG_PROMPT, 64), "cohere2": (hf_tiny.LONG_PROMPT, 64)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    return hf_tiny.converted(tmp_path_factory, CASES, "fused_models")


_fields = hf_tiny.gguf_fields
_tensors = hf_tiny.gguf_tensors


def _logits(path, ids, n_ctx, chunk, n_gpu_layers=0, kv_type="f32"):
    m = _ember.Model(str(path), n_gpu_layers=n_gpu_layers)
    ctx = _ember.Context(m, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, type_k=kv_type, type_v=kv_type)
    rows = []
    for start in range(0, len(ids), chunk):
        piece = list(ids[start:start + chunk])
        ctx.eval(piece, logits_all=True)
        rows += [np.asarray(ctx.logits(i)) for i in range(len(piece))]
    return np.stack(rows)


def test_phi3_file(models):
    d, sd, path = models["phi3"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "phi3"
    assert kv["phi3.rope.dimension_count"] == 8   # half of each 16-wide head
    assert kv["phi3.attention.sliding_window"] == 8
    assert kv["phi3.rope.scaling.original_context_length"] == 32
    assert kv["phi3.context_length"] == 128
    # transformers' LongRoPE attention factor for 128 positions over an original 32.
    assert kv["phi3.rope.scaling.attn_factor"] == pytest.approx(np.sqrt(1 + np.log(4) / np.log(32)))
    assert "phi3.rope.scaling.type" not in kv
    np.testing.assert_array_equal(t["rope_factors_long.weight"], np.float32([1.2, 2.5, 4.0, 9.0]))
    np.testing.assert_array_equal(t["rope_factors_short.weight"], np.float32([1.0, 1.3, 2.1, 3.7]))
    block = ["attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"]
    assert set(t) == {"token_embd.weight", "output_norm.weight", "output.weight", "rope_factors_long.weight",
                      "rope_factors_short.weight"} | {f"blk.{i}.{n}.weight" for i in range(2) for n in block}
    # No Q/K permutation (neox rope) and the fused matrices as the checkpoint has them.
    np.testing.assert_array_equal(t["blk.1.attn_qkv.weight"], sd["model.layers.1.self_attn.qkv_proj.weight"])
    np.testing.assert_array_equal(t["blk.0.ffn_up.weight"], sd["model.layers.0.mlp.gate_up_proj.weight"])


def test_mistral3_file(models):
    _, sd, path = models["ministral3"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "mistral3"
    assert kv["mistral3.attention.temperature_scale"] == pytest.approx(0.3)
    assert kv["mistral3.rope.scaling.yarn_log_multiplier"] == pytest.approx(0.5)
    assert kv["mistral3.rope.scaling.original_context_length"] == 16
    assert kv["mistral3.rope.scaling.factor"] == pytest.approx(8.0)
    block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    assert set(t) == {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(2) for n in block}
    # llama's Q/K row permutation (rope on adjacent pairs).
    q = sd["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"],
                                  q.reshape(4, 2, 8, 64).swapaxes(1, 2).reshape(q.shape))


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model."])
def test_mistral3_multimodal_checkpoint_gives_the_text_model(models, tmp_path, prefix):
    """Mistral3ForConditionalGeneration (Ministral 3, Mistral Small 3.x as released): the language
    model under its prefix, the untied head beside it (or inside it, older transformers), Pixtral's
    vision tower and projector left out; the file is the text model's, key for key and bit for bit."""
    d, sd, text_path = models["ministral3"]
    mm = tmp_path / "mm"
    shutil.copytree(d, mm)
    cfg = json.loads((mm / "config.json").read_text(encoding="utf-8"))
    (mm / "config.json").write_text(json.dumps({
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "text_config": cfg,
        "vision_config": {"model_type": "pixtral", "hidden_size": 16}}), encoding="utf-8")
    for f in mm.glob("*.safetensors*"):
        f.unlink()
    rng = np.random.default_rng(5)
    head = "lm_head.weight" if prefix.startswith("model.") else "language_model.lm_head.weight"
    tensors = {(head if n == "lm_head.weight" else prefix + n[len("model."):]): w for n, w in sd.items()}
    tensors["model.vision_tower.patch_conv.weight"] = rng.standard_normal((16, 3, 2, 2)).astype(np.float32)
    tensors["model.multi_modal_projector.linear_1.weight"] = rng.standard_normal((64, 16)).astype(np.float32)
    hf_tiny._write_safetensors(str(mm / "model.safetensors"), tensors, "float32")
    path = str(tmp_path / "mm.gguf")
    convert(str(mm), path, "f32", name="ministral3", progress=False)
    got, want = _fields(path), _fields(text_path)
    assert {k: v for k, v in got.items() if k != "general.name"} == {
        k: v for k, v in want.items() if k != "general.name"}
    t, w = _tensors(path), _tensors(text_path)
    assert set(t) == set(w)
    for name in w:
        np.testing.assert_array_equal(t[name], w[name])


def test_glm4_file(models):
    _, sd, path = models["glm4"]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == "glm4"
    assert kv["glm4.rope.dimension_count"] == 8   # half of each 16-wide head
    block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "post_attention_norm", "ffn_norm", "ffn_up",
             "ffn_down", "post_ffw_norm"]
    assert set(t) == {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(2) for n in block} | {
        f"blk.{i}.attn_{x}.bias" for i in range(2) for x in "qkv"}
    # HF keeps GLM-4's rotary pairs adjacent already: no permutation.
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"], sd["model.layers.0.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(t["blk.1.ffn_up.weight"], sd["model.layers.1.mlp.gate_up_proj.weight"])
    np.testing.assert_array_equal(t["blk.1.post_attention_norm.weight"],
                                  sd["model.layers.1.post_self_attn_layernorm.weight"])
    np.testing.assert_array_equal(t["blk.1.ffn_norm.weight"], sd["model.layers.1.post_attention_layernorm.weight"])
    np.testing.assert_array_equal(t["blk.0.post_ffw_norm.weight"], sd["model.layers.0.post_mlp_layernorm.weight"])


@pytest.mark.parametrize("name", ["command-r", "cohere2"])
def test_cohere_file(models, name):
    _, sd, path = models[name]
    kv, t = _fields(path), _tensors(path)
    assert kv["general.architecture"] == name
    assert kv[f"{name}.logit_scale"] == pytest.approx(0.3)
    assert kv[f"{name}.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    n_layer = 8 if name == "cohere2" else 2
    assert set(t) == {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(n_layer) for n in block}
    # transformers' Cohere rotates adjacent pairs already: no permutation.
    np.testing.assert_array_equal(t["blk.1.attn_k.weight"], sd["model.layers.1.self_attn.k_proj.weight"])
    if name == "cohere2":
        assert kv["cohere2.attention.sliding_window"] == 8
        assert "cohere2.attention.sliding_window_pattern" not in kv   # llama.cpp's default period 4


def test_cohere2_global_layers_see_everything(models, hf_reference, tmp_path):
    """cohere2 with every layer global (a pattern of 1) leaves transformers' logits: the windows of
    the three local layers of each four are what the match depends on."""
    ids, n_ctx = CASES["cohere2"]
    want = hf_reference.logits("cohere2", ids)
    path = _rewritten(models["cohere2"][2], str(tmp_path / "global.gguf"),
                      **{"cohere2.attention.sliding_window": (4096, U32)})
    got = _logits(path, ids, n_ctx, 64)
    assert np.abs(got - want).max() / np.abs(want).max() > 1e-3


def test_attention_temperature_matters(models, hf_reference, tmp_path):
    """The same file without its temperature key leaves transformers' logits on the long prompt
    (positions past the original 16 scale their queries), so the match above depends on it."""
    ids, n_ctx = CASES["ministral3"]
    want = hf_reference.logits("ministral3", ids)
    path = _rewritten(models["ministral3"][2], str(tmp_path / "cold.gguf"),
                      drop_keys=("mistral3.attention.temperature_scale",))
    got = _logits(path, ids, n_ctx, 64)
    assert np.abs(got - want).max() / np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got[:16], want[:16], rtol=0, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(models, hf_reference, name, chunk):
    ids, n_ctx = CASES[name]
    want = hf_reference.logits(name, ids)
    got = _logits(models[name][2], ids, n_ctx, chunk)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"


def test_long_factors_only_past_the_original_context(models, hf_reference):
    """The short prompt in a context longer than the original one rotates with the long factors (as
    llama.cpp decides by n_ctx): its logits then differ from transformers' short-factor ones."""
    ids, _ = CASES["phi3-short"]
    want = hf_reference.logits("phi3-short", ids)
    rel = np.abs(_logits(models["phi3-short"][2], ids, 64, 64) - want).max() / np.abs(want).max()
    assert rel > 1e-2


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (partial rope in the rope and rope-store kernels, LongRoPE tables, the
    fused tensors' row views uploaded as weights) against the CPU, both with the f16 KV cache."""
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    ids, n_ctx = CASES[name]
    path = models[name][2]
    want = _logits(path, ids, n_ctx, 64, kv_type="f16")
    got = _logits(path, ids, n_ctx, chunk, n_gpu_layers=-1, kv_type="f16")
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 2e-3, f"{name}: max|diff|/max|ref| = {rel:.2e}"


GREEDY = hf_tiny.ROOT / "tests" / "reference" / "fused_families" / "llama_cpp_greedy.json"


# name -> config changes of the tiny phi3 (tools/gen_fused_greedy_references.py's CASES).
GREEDY_CASES = {"phi3-long": {"sliding_window": None},
                "phi3-short": {"sliding_window": None, "original_max_position_embeddings": 512,
                               "max_position_embeddings": 2048},
                "mistral3": {}, "glm4": {}, "command-r": {}, "cohere2": {}}
GREEDY_MODEL = {"phi3-long": "phi3", "phi3-short": "phi3", "mistral3": "ministral3", "glm4": "glm4",
                "command-r": "command-r", "cohere2": "cohere2"}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_text_matches_llama_cpp(models, tmp_path, case):
    """llama.cpp (llama-simple: CPU, greedy, f16 KV cache) loads the converted file (without the
    window, which llama.cpp turns off for Phi-3); the bytes of its pieces are those of ember's greedy
    tokens (tools/gen_fused_greedy_references.py). llama.cpp's context (256) passes the original 32
    positions of the long case (long factors) and not the 512 of the short one; ember's 128 too."""
    from ember.llama import Llama

    ref = json.loads(GREEDY.read_text(encoding="utf-8"))[case]
    d = hf_tiny.edited(models[GREEDY_MODEL[case]][0], str(tmp_path / case), lambda cfg: cfg.update(GREEDY_CASES[case]))
    path = str(tmp_path / f"{case}.gguf")
    convert(d, path, "f32", progress=False)
    with Llama(path, n_ctx=128, verbose=False) as llm:
        ids = llm.tokenize(ref["prompt"].encode("utf-8"), add_bos=True, special=True)
        out = []
        llm.eval(ids)
        for _ in range(ref["n_predict"]):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if tok == llm.token_eos():
                break
            out.append(tok)
            llm.eval([tok])
        got = llm.detokenize(out, special=True)
    assert got == bytes.fromhex(ref["text_hex"]), got


def _rope(**changes):
    return lambda cfg: cfg["rope_parameters"].update(changes)


@pytest.mark.parametrize("name,edit,needle", [
    ("phi3", _rope(long_factor=[1.0, 2.0]), "LongRoPE's 'long_factor' must be a list of 4 numbers"),
    ("phi3", _rope(short_factor=[1.0, -2.0, 1.0, 1.0]), "LongRoPE's 'short_factor' must be positive"),
    ("phi3", _rope(partial_rotary_factor=1.5), "'partial_rotary_factor' must be in (0, 1]"),
    ("phi3", _rope(partial_rotary_factor=0.1), "rotates 1 dimensions of a head of 16"),
    ("phi3", _rope(rope_type="dynamic"), "unsupported rope scaling 'dynamic'"),
    ("phi3", lambda cfg: cfg.update(sliding_window=-3), "'sliding_window' must be a non-negative integer"),
    ("ministral3", _rope(mscale=2.0), "rope scaling 'yarn' with mscale 2.0 is not supported"),
    ("ministral3", _rope(llama_4_scaling_beta=-0.1), "'llama_4_scaling_beta' must be a non-negative number"),
    ("ministral3", lambda cfg: cfg.update(sliding_window=4096), "sliding-window attention is not supported"),
    ("glm4", lambda cfg: cfg.update(attention_bias=False), "attention_bias=false is not supported for glm4"),
    ("glm4", _rope(partial_rotary_factor=0.3125), "rotates 5 dimensions"),
    ("glm4", _rope(mrope_section=[8, 12, 12]), "multimodal rope (mrope_section) is not supported"),
    ("cohere2", lambda cfg: cfg.update(use_qk_norm=True), "use_qk_norm=true (per-head q/k LayerNorms) is not"),
    ("command-r", lambda cfg: cfg.update(logit_scale=0), "'logit_scale' must be a positive number"),
    ("cohere2", lambda cfg: cfg.update(sliding_window=None), "'sliding_window' must be a positive integer"),
    ("cohere2", lambda cfg: cfg.update(layer_types=["full_attention"] * 3), "'layer_types' must name"),
])
def test_bad_config_gives_clear_error(models, tmp_path, name, edit, needle):
    d = hf_tiny.edited(models[name][0], str(tmp_path / "bad"), edit)
    with pytest.raises(ConvertError, match=None) as e:
        convert(d, str(tmp_path / "bad.gguf"), "f32", progress=False)
    assert needle in str(e.value)
    assert not os.path.exists(tmp_path / "bad.gguf")


def _rewritten(src, dst, drop=(), drop_keys=(), **changes):
    """src's GGUF with keys changed (name -> (value, GGUFValueType)) or dropped, and tensors dropped."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        if name in changes:
            value, vtype = changes.pop(name)
            w.add_key_value(name, value, vtype)
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    for name, (value, vtype) in changes.items():
        w.add_key_value(name, value, vtype)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)]),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


@pytest.mark.parametrize("drop,changes,needle", [
    ((), {"phi3.rope.dimension_count": (7, U32)}, "rope.dimension_count 7 must be even"),
    ((), {"phi3.rope.dimension_count": (32, U32)}, "rope.dimension_count 32 must be even"),
    ((), {"phi3.rope.scaling.attn_factor": (-1.0, F32)}, "rope.scaling.attn_factor must be positive"),
    (("rope_factors_long.weight",), {}, "LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight"),
    ((), {"phi3.rope.dimension_count": (4, U32)}, "tensor 'rope_factors_short.weight' must be F32 [2]"),
    ((), {"mistral3.attention.temperature_scale": (0.1, F32),
          "mistral3.rope.scaling.original_context_length": (0, U32)},
     "temperature_scale needs a positive mistral3.rope.scaling.original_context_length, got 0"),
    ((), {"command-r.logit_scale": (-1.0, F32)}, "command-r.logit_scale must be positive"),
    ((), {"cohere2.attention.sliding_window": (0, U32)}, "cohere2.attention.sliding_window must be positive"),
    ((), {"cohere2.attention.sliding_window_pattern": (0, U32)}, "sliding_window_pattern must be positive"),
])
def test_bad_file_gives_clear_error(models, tmp_path, drop, changes, needle):
    arch = next((k.split(".")[0] for k in changes), "phi3")
    name = {"mistral3": "ministral3", "command-r": "command-r", "cohere2": "cohere2"}.get(arch, "phi3")
    path = _rewritten(models[name][2], str(tmp_path / "bad.gguf"), drop, **changes)
    with pytest.raises(ValueError) as e:
        _ember.Model(path)
    assert needle in str(e.value)
