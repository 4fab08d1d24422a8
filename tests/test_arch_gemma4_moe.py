"""Gemma 4's mixture (26B-A4B): a tiny random HF Gemma4ForCausalLM with enable_moe_block
(tools/gen_hf_references.py "gemma4-moe": every layer a dense GeGLU MLP beside 4 GeGLU experts, top 2)
converted by ember-convert. The GGUF keys and tensors must be those llama.cpp's converter writes
(fused ffn_gate_up_exps, the router's scale, each expert's output scale as ffn_down_exps.scale);
ember's logits must match transformers' at f32 (one batch, token by token, inside an engine batch);
the experts' gate and up as two tensors (which llama.cpp reads too) give the same logits bit for bit;
configs and files without the experts' tensors or keys, or with both layouts, give a clear error naming them."""
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
NAME = "gemma4-moe"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(HF dir, float32 weights exactly as stored, path of its f32 GGUF)."""
    return hf_tiny.converted(tmp_path_factory, [NAME], "gemma4_moe_models")[NAME]


def test_file_has_llama_cpp_keys_and_tensors(model):
    _, sd, path = model
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert kv["general.architecture"] == "gemma4"
    assert kv["gemma4.expert_count"] == 4 and kv["gemma4.expert_used_count"] == 2
    assert kv["gemma4.expert_feed_forward_length"] == 32 and kv["gemma4.feed_forward_length"] == 96
    for i in range(4):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        # The dense MLP stays beside the experts.
        assert t[g + "ffn_gate.weight"].shape == (96, 64)
        np.testing.assert_array_equal(t[g + "ffn_gate_inp.weight"], sd[p + "router.proj.weight"])
        np.testing.assert_array_equal(t[g + "ffn_gate_inp.scale"], sd[p + "router.scale"])
        np.testing.assert_array_equal(t[g + "ffn_down_exps.scale"], sd[p + "router.per_expert_scale"])
        # Gate rows then up rows, per expert, as transformers' gate_up_proj.
        assert t[g + "ffn_gate_up_exps.weight"].shape == (4, 64, 64)
        np.testing.assert_array_equal(t[g + "ffn_gate_up_exps.weight"], sd[p + "experts.gate_up_proj"])
        np.testing.assert_array_equal(t[g + "ffn_down_exps.weight"], sd[p + "experts.down_proj"])
        for hf, name in (("pre_feedforward_layernorm_2", "pre_ffw_norm_2"),
                         ("post_feedforward_layernorm_1", "post_ffw_norm_1"),
                         ("post_feedforward_layernorm_2", "post_ffw_norm_2")):
            np.testing.assert_array_equal(t[f"{g}{name}.weight"], sd[f"{p}{hf}.weight"])
        assert g + "ffn_gate_exps.weight" not in t and g + "ffn_up_exps.weight" not in t


@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
def test_logits_match_transformers(model, hf_reference, chunk):
    want = hf_reference.logits(NAME, PROMPT)
    got = hf_tiny.ember_logits(model[2], PROMPT, chunk=chunk)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, f"max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_inside_an_engine_batch(model, hf_reference, device):
    """The reference prompt among other sequences of the engine's steps: experts routed over the
    rows of several sequences at once."""
    hf_tiny.check_inside_an_engine_batch(model[2], hf_reference, NAME, device, PROMPT)


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
def test_cuda_logits_match_cpu(model, chunk):
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    want = hf_tiny.ember_logits(model[2], PROMPT, kv_type="f16")
    got = hf_tiny.ember_logits(model[2], PROMPT, n_gpu_layers=-1, kv_type="f16", chunk=chunk)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 2e-3, f"max|diff|/max|ref| = {rel:.2e}"


# --------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("fields,by", [
    (dict(cpu_moe=True), "cpu_moe"),
    (dict(n_cpu_moe=1), "n_cpu_moe"),
    (dict(override_tensor=[r"blk\.3\.ffn_.*exps=CPU"]), "override_tensor"),
    (dict(n_gpu_layers=2, n_cpu_moe=3), "n_cpu_moe"),
])
def test_experts_apart_from_their_gpu_block_are_refused_at_load(model, fields, by):
    """gemma4's experts run on their block's backend only: a GPU block's experts put on the CPU are refused
    when the file is placed, naming the architecture, the tensor, the option that put it there and why.
    placement_plan plans as if CUDA were built in, so a CPU-only build exercises the check Model.load makes."""
    fields = {"n_gpu_layers": -1, **fields}
    with pytest.raises(Exception, match=rf"gemma4 cannot have a GPU block's experts on the CPU \(blk\.\d\.ffn_\w+"
                                        rf"\.\w+ by {by}\): .*their block's backend only.*n_gpu_layers") as e:
        _ember.placement_plan(model[2], have_gpu=True, **fields)
    assert str(e.value).startswith(model[2]), str(e.value)


@pytest.mark.parametrize("fields,blocks", [
    (dict(n_gpu_layers=-1), ["CUDA"] * 4),
    (dict(n_gpu_layers=0, cpu_moe=True), ["CPU"] * 4),
    (dict(n_gpu_layers=2, n_cpu_moe=2), ["CPU", "CPU", "CUDA", "CUDA"]),
    (dict(n_gpu_layers=-1, override_tensor=[r"blk\.1\.=CPU"]), ["CUDA", "CPU", "CUDA", "CUDA"]),
])
def test_experts_with_their_blocks_are_placed(model, fields, blocks):
    """Experts on their block's device are accepted wherever the blocks go (n_cpu_moe of CPU blocks only)."""
    p = _ember.placement_plan(model[2], have_gpu=True, **fields)
    assert p["blocks"] == p["experts"] == blocks and p["warning"] == ""


def test_gpu_budget_keeps_the_experts_with_their_blocks(model):
    """A GPU budget the blocks exceed moves no experts apart (as it would for other mixtures): the plan keeps
    them on the GPU and warns that the tensors exceed the budget, saying why and to lower n_gpu_layers."""
    # 1 MiB free, less the 1 GiB margin: a budget of nothing.
    p = _ember.placement_plan(model[2], have_gpu=True, n_gpu_layers=-1, moe_gpu_budget_mb=0, gpu_free_mb=1)
    assert p["blocks"] == p["experts"] == ["CUDA"] * 4
    w = p["warning"]
    assert "over the GPU budget of 0.0 MiB" in w and "gemma4's experts stay with their blocks" in w, w
    assert "lower n_gpu_layers" in w and "moved to the CPU" not in p["summary"], p


@pytest.mark.parametrize("changes,needle", [
    (dict(top_k_experts=5), "top_k_experts=5 exceeds num_experts=4"),
    (dict(num_experts=None), "'num_experts' must be a positive integer, got None"),
    (dict(moe_intermediate_size=0), "'moe_intermediate_size' must be a positive integer, got 0"),
])
def test_bad_config_gives_clear_error(model, tmp_path, changes, needle):
    d = hf_tiny.edited(model[0], str(tmp_path / "m"), changes)
    out = str(tmp_path / "o.gguf")
    with pytest.raises(ConvertError) as e:
        convert(d, out, "f32", progress=False)
    assert not os.path.exists(out)
    assert "config.json" in str(e.value) and needle in str(e.value), str(e.value)


def test_missing_checkpoint_tensor_is_named(model, tmp_path):
    d = hf_tiny.edited(model[0], str(tmp_path / "m"), {})
    weights = {k: v for k, v in model[1].items() if k != "model.layers.1.experts.down_proj"}
    hf_tiny._write_safetensors(os.path.join(d, "model.safetensors"), weights, "float32")
    with pytest.raises(ConvertError, match=r"missing tensor model\.layers\.1\.experts\.down_proj"):
        convert(d, str(tmp_path / "o.gguf"), "f32", progress=False)


@pytest.mark.parametrize("drop,fields,needle", [
    (("blk.2.ffn_gate_up_exps.weight",), {}, "tensor 'blk.2.ffn_gate_up_exps.weight' is missing"),
    (("blk.3.ffn_down_exps.weight",), {}, "blk.3.ffn_down_exps.weight"),
    (("blk.0.ffn_gate_inp.scale",), {}, "blk.0.ffn_gate_inp.scale"),
    ((), {"gemma4.expert_count": None, "gemma4.expert_used_count": None}, "no gemma4.expert_count"),
    ((), {"gemma4.expert_used_count": None}, "gemma4.expert_used_count"),
])
def test_bad_file_gives_clear_error(model, tmp_path, drop, fields, needle):
    path = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(model[2], path, drop=drop, fields=fields)
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        _ember.Model(path)


def _split_experts(model, tmp_path, keep_fused=(), drop_up=()):
    """The tiny mixture rewritten with each layer's experts' gate and up as ffn_gate_exps and ffn_up_exps (as
    llama.cpp reads them too); the fused tensor kept in the layers keep_fused, the up one dropped in drop_up."""
    t = hf_tiny.gguf_tensors(model[2])
    fused = [n for n in t if n.endswith("ffn_gate_up_exps.weight")]
    extra = []
    for n in fused:
        g = n[:-len("ffn_gate_up_exps.weight")]
        extra.append((g + "ffn_gate_exps.weight", np.ascontiguousarray(t[n][:, :32])))
        if g not in drop_up:
            extra.append((g + "ffn_up_exps.weight", np.ascontiguousarray(t[n][:, 32:])))
    path = str(tmp_path / "split.gguf")
    hf_tiny.rewritten_gguf(model[2], path, drop=[n for n in fused if n[:-len("ffn_gate_up_exps.weight")]
                                                not in keep_fused], extra=extra)
    return path


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
def test_separate_gate_and_up_experts_give_the_same_logits(model, tmp_path, chunk, device):
    """The experts' gate and up as two tensors (llama.cpp reads this layout beside the fused one): the same
    logits as the fused file on the same device, bit for bit on the CPU; on CUDA cuBLAS picks its algorithm
    by the matrix's shape (gate and up apart are half the fused one's rows), so within rounding there."""
    if device == "cuda" and "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    path = _split_experts(model, tmp_path)
    t = hf_tiny.gguf_tensors(path)
    assert "blk.0.ffn_gate_up_exps.weight" not in t and t["blk.0.ffn_gate_exps.weight"].shape == (4, 32, 64)
    kw = dict(n_gpu_layers=-1, kv_type="f16") if device == "cuda" else {}
    want = hf_tiny.ember_logits(model[2], PROMPT, chunk=chunk, **kw)
    got = hf_tiny.ember_logits(path, PROMPT, chunk=chunk, **kw)
    if device == "cpu":
        np.testing.assert_array_equal(got, want)
    else:
        rel = np.abs(got - want).max() / np.abs(want).max()
        assert rel <= 1e-5, f"max|diff|/max|ref| = {rel:.2e}"


def test_fused_and_separate_experts_together_are_refused_by_name(model, tmp_path):
    path = _split_experts(model, tmp_path, keep_fused=("blk.2.",))
    with pytest.raises(ValueError, match=r"gemma4 layer 2 has both 'blk\.2\.ffn_gate_up_exps\.weight' and "
                                         r"'blk\.2\.ffn_gate_exps\.weight': the experts' gate and up are either "
                                         r"fused or separate, not both") as e:
        _ember.Model(path)
    assert str(e.value).startswith(path), str(e.value)


def test_separate_gate_without_up_is_refused_by_name(model, tmp_path):
    path = _split_experts(model, tmp_path, drop_up=("blk.1.",))
    with pytest.raises(ValueError, match=r"tensor 'blk\.1\.ffn_up_exps\.weight' is missing \(separate experts "
                                         r"need both ffn_gate_exps and ffn_up_exps\)"):
        _ember.Model(path)
