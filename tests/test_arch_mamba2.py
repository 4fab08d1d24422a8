"""Mamba2 hybrids (issue 44): Nemotron-H (Mamba2, rope-less attention and squared-ReLU MLP layers, or mixtures
of squared-ReLU experts: nemotron_h_moe) and
Granite 4.0 hybrid (Mamba2 or attention layers, each with a SwiGLU feed-forward or experts beside a shared
expert, muP multipliers) converted
by ember-convert from tiny random transformers models: the GGUF keys and tensors as llama.cpp's converter
writes them, ember's logits against transformers' at f32 (one batch, token by token, chunks carrying the
states), inside an engine batch and from the engine's prefix cache, and the errors for bad files and configs."""
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
from ember.convert_arch import permute_qk  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

PROMPT = hf_tiny.LONG_PROMPT
# nemotron_h: Mamba2 layers 0 and 3 (8 heads of 16, 2 groups, states of 16), attention in layer 2, MLPs in
# layers 1 and 4; granitehybrid: Mamba2 layers 0, 1 and 3, attention in layer 2; granitehybrid-moe: Mamba2
# layers 0 and 2 around attention, 4 experts of 32 (top 2) and a shared expert of 48 in every layer;
# nemotron_h_moe: nemotron_h with its MLP layers mixtures (4 experts of 32, top 2 by sigmoid score, shared 48).
MODELS = ["nemotron_h", "granitehybrid", "granitehybrid-moe", "nemotron_h_moe"]
# Those that run on the GPU; nemotron_h_moe's ungated squared-ReLU experts stay on the CPU.
GPU_MODELS = ["nemotron_h", "granitehybrid", "granitehybrid-moe"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_tiny.converted(tmp_path_factory, MODELS, "mamba2")


def _mamba2_tensors_match(t, sd, block, prefix):
    np.testing.assert_array_equal(t[block + "ssm_in.weight"], sd[prefix + "in_proj.weight"])
    np.testing.assert_array_equal(t[block + "ssm_conv1d.weight"], sd[prefix + "conv1d.weight"][:, 0, :])
    np.testing.assert_array_equal(t[block + "ssm_conv1d.bias"], sd[prefix + "conv1d.bias"])
    np.testing.assert_array_equal(t[block + "ssm_dt.bias"], sd[prefix + "dt_bias"])
    np.testing.assert_allclose(t[block + "ssm_a"], -np.exp(sd[prefix + "A_log"])[:, None], rtol=1e-6)
    np.testing.assert_array_equal(t[block + "ssm_d"], sd[prefix + "D"][:, None])
    np.testing.assert_array_equal(t[block + "ssm_norm.weight"], sd[prefix + "norm.weight"].reshape(2, 64))
    np.testing.assert_array_equal(t[block + "ssm_out.weight"], sd[prefix + "out_proj.weight"])


def test_nemotron_h_file(models):
    hf_dir, sd, path = models["nemotron_h"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "nemotron_h."
    assert kv["general.architecture"] == "nemotron_h" and kv[a + "block_count"] == 5
    # The layer kinds: both 0 a Mamba2 layer, a width an MLP, KV heads an attention layer.
    assert list(kv[a + "feed_forward_length"]) == [0, 160, 0, 0, 160]
    assert list(kv[a + "attention.head_count_kv"]) == [0, 0, 2, 0, 0]
    assert kv[a + "ssm.conv_kernel"] == 4 and kv[a + "ssm.state_size"] == 16 and kv[a + "ssm.group_count"] == 2
    assert kv[a + "ssm.time_step_rank"] == 8 and kv[a + "ssm.inner_size"] == 128
    assert kv[a + "attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert t["token_embd.weight"].shape == (400, 64)
    np.testing.assert_array_equal(t["output_norm.weight"], sd["backbone.norm_f.weight"])
    np.testing.assert_array_equal(t["blk.3.attn_norm.weight"], sd["backbone.layers.3.norm.weight"])
    _mamba2_tensors_match(t, sd, "blk.3.", "backbone.layers.3.mixer.")
    np.testing.assert_array_equal(t["blk.4.ffn_up.weight"], sd["backbone.layers.4.mixer.up_proj.weight"])
    np.testing.assert_array_equal(t["blk.4.ffn_down.weight"], sd["backbone.layers.4.mixer.down_proj.weight"])
    # q and k rows in llama's rope layout, as llama.cpp writes them.
    np.testing.assert_array_equal(t["blk.2.attn_q.weight"], permute_qk(sd["backbone.layers.2.mixer.q_proj.weight"], 4))
    np.testing.assert_array_equal(t["blk.2.attn_k.weight"], permute_qk(sd["backbone.layers.2.mixer.k_proj.weight"], 2))
    assert "blk.0.attn_q.weight" not in t and "blk.1.ssm_in.weight" not in t and "blk.2.ffn_up.weight" not in t
    # Mamba2's small tensors stay f32 at any outtype, as llama.cpp keeps them.
    f16 = os.path.join(os.path.dirname(path), "nemotron_h-f16.gguf")
    convert(hf_dir, f16, "f16", progress=False)
    types = {x.name: x.tensor_type for x in gguf.GGUFReader(f16).tensors}
    F32 = gguf.GGMLQuantizationType.F32
    for name in ("ssm_a", "ssm_d", "ssm_norm.weight", "ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias"):
        assert types["blk.0." + name] == F32, name
    assert types["blk.0.ssm_in.weight"] == gguf.GGMLQuantizationType.F16


def test_granitehybrid_file(models):
    _, sd, path = models["granitehybrid"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "granitehybrid."
    assert kv["general.architecture"] == "granitehybrid" and kv[a + "block_count"] == 4
    assert list(kv[a + "attention.head_count_kv"]) == [0, 0, 2, 0] and kv[a + "feed_forward_length"] == 160
    assert kv[a + "rope.scaling.finetuned"] is False
    assert (kv[a + "embedding_scale"], kv[a + "residual_scale"], kv[a + "attention.scale"],
            kv[a + "logit_scale"]) == (2.0, 0.5, 0.5, 2.5)
    _mamba2_tensors_match(t, sd, "blk.1.", "model.layers.1.mamba.")
    fused = sd["model.layers.1.shared_mlp.input_linear.weight"]
    np.testing.assert_array_equal(t["blk.1.ffn_gate.weight"], fused[:160])
    np.testing.assert_array_equal(t["blk.1.ffn_up.weight"], fused[160:])
    np.testing.assert_array_equal(t["blk.1.ffn_down.weight"], sd["model.layers.1.shared_mlp.output_linear.weight"])
    np.testing.assert_array_equal(t["blk.2.ffn_norm.weight"], sd["model.layers.2.post_attention_layernorm.weight"])
    np.testing.assert_array_equal(t["blk.2.attn_k.weight"], permute_qk(sd["model.layers.2.self_attn.k_proj.weight"], 2))
    assert "blk.2.ssm_in.weight" not in t and "blk.0.attn_q.weight" not in t


def test_granitehybrid_moe_file(models):
    _, sd, path = models["granitehybrid-moe"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "granitehybrid."
    assert (kv[a + "expert_count"], kv[a + "expert_used_count"]) == (4, 2)
    assert kv[a + "feed_forward_length"] == 32 and kv[a + "expert_shared_feed_forward_length"] == 48
    moe, shared = "model.layers.1.block_sparse_moe.", "model.layers.1.shared_mlp."
    np.testing.assert_array_equal(t["blk.1.ffn_gate_inp.weight"], sd[moe + "router.layer.weight"])
    fused = sd[moe + "input_linear.weight"]
    np.testing.assert_array_equal(t["blk.1.ffn_gate_exps.weight"], fused[:, :32])
    np.testing.assert_array_equal(t["blk.1.ffn_up_exps.weight"], fused[:, 32:])
    np.testing.assert_array_equal(t["blk.1.ffn_down_exps.weight"], sd[moe + "output_linear.weight"])
    np.testing.assert_array_equal(t["blk.1.ffn_gate_shexp.weight"], sd[shared + "input_linear.weight"][:48])
    np.testing.assert_array_equal(t["blk.1.ffn_up_shexp.weight"], sd[shared + "input_linear.weight"][48:])
    np.testing.assert_array_equal(t["blk.1.ffn_down_shexp.weight"], sd[shared + "output_linear.weight"])
    assert "blk.1.ffn_gate.weight" not in t


def test_nemotron_h_moe_file(models):
    _, sd, path = models["nemotron_h_moe"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "nemotron_h_moe."
    assert kv["general.architecture"] == "nemotron_h_moe"
    assert list(kv[a + "feed_forward_length"]) == [0, 32, 0, 0, 32]
    assert (kv[a + "expert_count"], kv[a + "expert_used_count"], kv[a + "expert_feed_forward_length"],
            kv[a + "expert_shared_feed_forward_length"]) == (4, 2, 32, 48)
    assert kv[a + "expert_weights_norm"] is True and kv[a + "expert_weights_scale"] == 1.5
    p = "backbone.layers.4.mixer."
    np.testing.assert_array_equal(t["blk.4.ffn_gate_inp.weight"], sd[p + "gate.weight"])
    np.testing.assert_array_equal(t["blk.4.exp_probs_b.bias"], sd[p + "gate.e_score_correction_bias"])
    np.testing.assert_array_equal(t["blk.4.ffn_up_exps.weight"][3], sd[p + "experts.3.up_proj.weight"])
    np.testing.assert_array_equal(t["blk.4.ffn_down_exps.weight"][1], sd[p + "experts.1.down_proj.weight"])
    np.testing.assert_array_equal(t["blk.4.ffn_up_shexp.weight"], sd[p + "shared_experts.up_proj.weight"])
    np.testing.assert_array_equal(t["blk.4.ffn_down_shexp.weight"], sd[p + "shared_experts.down_proj.weight"])


def test_layer_pattern_string_gives_the_same_file(models, tmp_path):
    """Released Nemotron-H configs give the layers as hybrid_override_pattern ("M-*M-")."""
    def to_pattern(cfg):
        del cfg["layers_block_type"]
        cfg["hybrid_override_pattern"] = "M-*M-"
        cfg["num_hidden_layers"] = 5
    d = hf_tiny.edited(models["nemotron_h"][0], str(tmp_path / "hf"), to_pattern)
    out = str(tmp_path / "pattern.gguf")
    convert(d, out, "f32", progress=False)
    want, got = hf_tiny.gguf_tensors(models["nemotron_h"][2]), hf_tiny.gguf_tensors(out)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


# ------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("chunk", [64, 1, 7])
def test_logits_match_transformers(models, hf_reference, name, chunk):
    """One batch, token by token, and chunks of 7 carrying the convolution and scan states."""
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=chunk)
    rel = hf_tiny.rel_diff(got, want)
    assert rel <= 1e-4, f"{name} chunk {chunk}: max|diff|/max|ref| = {rel:.2e}"


def test_prompt_that_does_not_extend_the_state_is_recomputed(models, hf_reference):
    """A context cut below what the states saw evaluates its kept tokens again."""
    want = hf_reference.logits("nemotron_h", PROMPT)
    rng = np.random.default_rng()
    cut = int(rng.integers(5, 30))
    m = _ember.Model(models["nemotron_h"][2], n_gpu_layers=0)
    ctx = _ember.Context(m, n_ctx=64, n_batch=8, n_threads=2, type_k="f32", type_v="f32")
    ctx.eval(PROMPT[:cut] + [int(x) for x in rng.integers(3, 390, size=12)], logits_all=False)
    ctx.truncate(cut)
    ctx.eval(PROMPT[cut:], logits_all=True)
    got = np.stack([np.asarray(ctx.logits(i)) for i in range(len(PROMPT) - cut)])
    assert hf_tiny.rel_diff(got, want[cut:]) <= 1e-4


@pytest.mark.parametrize("name,device", [(n, "cpu") for n in MODELS] + [(n, "cuda") for n in GPU_MODELS])
def test_inside_an_engine_batch(models, hf_reference, name, device):
    """The prompt's logprobs among other sequences' steps are transformers' (on the GPU the CPU's at the
    same f16 KV cache): each sequence runs on its own state slot, and the MLP-only layers keep neither KV
    nor state."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, device)


@pytest.mark.parametrize("chunk", [64, 1, 7], ids=["prompt", "decode", "chunks"])
@pytest.mark.parametrize("name", GPU_MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (the convolution, scan and grouped norm of the Mamba2 layers on their
    state slots in device memory, the squared ReLU, rope-less attention, Granite's experts) against
    the CPU, both with the f16 KV cache; chunks of 7 carry the states between steps."""
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    path = models[name][2]
    want = hf_tiny.ember_logits(path, PROMPT, kv_type="f16")
    got = hf_tiny.ember_logits(path, PROMPT, n_gpu_layers=-1, kv_type="f16", chunk=chunk)
    rel = hf_tiny.rel_diff(got, want)
    assert rel <= 2e-3, f"{name} chunk {chunk}: max|diff|/max|ref| = {rel:.2e}"


def test_engine_resumes_a_cached_prefix_and_frees_every_slot(models, hf_reference):
    """A second request sharing 36 tokens is served 32 from the prefix cache (the state kept at 32),
    with the greedy tokens of an engine caching nothing; prompt logprobs are transformers'; afterwards
    every state slot is free."""
    m = _ember.Model(models["nemotron_h"][2], n_gpu_layers=0)
    kw = dict(n_ctx=96, max_num_seqs=2, max_num_batched_tokens=64, n_threads=2, type_k="f32", type_v="f32",
              kv_block_size=16)
    engine = _ember.Engine(m, state_snapshot_interval=16, **kw)
    plain = _ember.Engine(m, enable_prefix_caching=False, **kw)
    rng = np.random.default_rng()
    hf_tiny.engine_greedy(engine, PROMPT[:36] + [int(t) for t in rng.integers(3, 390, size=6)], max_tokens=4)
    before = engine.stats()["cached_prompt_tokens"]
    second = PROMPT[:36] + [int(t) for t in rng.integers(3, 390, size=5)]
    got, _ = hf_tiny.engine_greedy(engine, second, max_tokens=6)
    assert engine.stats()["cached_prompt_tokens"] - before == 32
    assert got == hf_tiny.engine_greedy(plain, second, max_tokens=6)[0]
    _, lps = hf_tiny.engine_greedy(engine, PROMPT, max_tokens=1, prompt_logprobs=True)
    want = hf_tiny.log_softmax(hf_reference.logits("nemotron_h", PROMPT))
    assert np.allclose(lps, [want[i, PROMPT[i + 1]] for i in range(len(PROMPT) - 1)], atol=1e-4)
    stats = engine.stats()
    assert stats["state_slots_free"] == stats["state_slots_total"] == 2
    engine.close()
    plain.close()


def test_engine_preempts_and_every_sequence_keeps_its_tokens(models):
    """A pool too small for every sequence: the newest are preempted and recomputed on a fresh slot, and
    each sequence's greedy tokens are those it has alone; afterwards every slot and block is free."""
    hf_tiny.check_engine_preemption(models["nemotron_h"][2])


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("fields", hf_tiny.GPU_PLACEMENTS, ids=["one-layer", "all", "override"])
@pytest.mark.parametrize("name", sorted(set(MODELS) - set(GPU_MODELS)))
def test_gpu_placement_is_refused_at_load(models, name, fields):
    hf_tiny.check_gpu_placement_refused(models[name][2], fields)


@pytest.mark.parametrize("name", GPU_MODELS)
def test_gpu_placement_is_planned(models, name):
    """Every block and the head on the GPU (placement_plan plans as if CUDA were built in)."""
    plan = _ember.placement_plan(models[name][2], have_gpu=True, n_gpu_layers=-1)
    assert set(plan["blocks"]) == {"CUDA"} and plan["head"] == "CUDA", plan["blocks"]


@pytest.mark.parametrize("name,drop,fields,needles", [
    ("nemotron_h", ("blk.3.ssm_a",), {}, ["blk.3.ssm_a"]),
    ("nemotron_h", ("blk.0.ssm_norm.weight",), {}, ["blk.0.ssm_norm.weight"]),
    ("nemotron_h", ("blk.4.ffn_down.weight",), {}, ["blk.4.ffn_down.weight"]),
    ("nemotron_h", ("blk.2.attn_v.weight",), {}, ["blk.2.attn_v.weight"]),
    ("nemotron_h", (), {"nemotron_h.ssm.conv_kernel": None}, ["nemotron_h.ssm.conv_kernel"]),
    ("nemotron_h", (), {"nemotron_h.ssm.group_count": 3}, ["group_count", "multiple"]),
    ("nemotron_h", (), {"nemotron_h.ssm.state_size": 8}, ["blk.0.ssm_in.weight", "shape"]),
    # Layer 1 with neither a feed-forward width nor KV heads is a Mamba2 layer, whose tensors the file lacks.
    ("nemotron_h", (), {"nemotron_h.feed_forward_length": [0, 0, 0, 0, 160]}, ["blk.1.ssm_in.weight"]),
    ("granitehybrid", ("blk.1.ssm_conv1d.weight",), {}, ["blk.1.ssm_conv1d.weight"]),
    ("granitehybrid", ("blk.2.ffn_gate.weight",), {}, ["blk.2.ffn_gate.weight"]),
    ("granitehybrid", (), {"granitehybrid.ssm.time_step_rank": None}, ["granitehybrid.ssm.time_step_rank"]),
    ("granitehybrid", (), {"granitehybrid.rope.scaling.finetuned": None}, ["rope.scaling.finetuned"]),
    ("granitehybrid-moe", ("blk.2.ffn_up_shexp.weight",), {}, ["blk.2.ffn_up_shexp.weight"]),
    ("nemotron_h_moe", ("blk.1.exp_probs_b.bias",), {}, ["blk.1.exp_probs_b.bias"]),
    ("nemotron_h_moe", (), {"nemotron_h_moe.expert_count": None}, ["nemotron_h_moe.expert_count"]),
    ("nemotron_h_moe", (), {"nemotron_h_moe.moe_latent_size": 16}, ["moe_latent_size"]),
    ("granitehybrid-moe", (), {"granitehybrid.expert_shared_feed_forward_length": None},
     ["granitehybrid.expert_shared_feed_forward_length"]),
])
def test_bad_file_gives_clear_error(models, tmp_path, name, drop, fields, needles):
    bad = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(models[name][2], bad, drop, fields)
    with pytest.raises(Exception) as e:
        _ember.Model(bad, n_gpu_layers=0)
    for n in needles:
        assert n in str(e.value), str(e.value)


@pytest.mark.parametrize("name,changes,needle", [
    ("nemotron_h", {"layers_block_type": ["linear_attention", "mlp", "full_attention", "mamba3", "mlp"]},
     "unknown layer type 'mamba3'"),
    ("nemotron_h", {"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
    ("nemotron_h", {"mamba_num_heads": 5}, "not a multiple of 'n_groups'"),
    ("nemotron_h", {"num_hidden_layers": 4}, "num_hidden_layers=4"),
    ("nemotron_h", {"use_conv_bias": False}, "unexpected tensor backbone.layers.0.mixer.conv1d.bias"),
    ("granitehybrid", {"layer_types": ["mamba", "attention"]}, "'layer_types' must list"),
    ("granitehybrid-moe", {"num_experts_per_tok": 5}, "exceeds num_local_experts"),
    ("nemotron_h_moe", {"moe_latent_size": 16}, "moe_latent_size"),
    ("nemotron_h_moe", {"n_group": 2, "topk_group": 1}, "group-limited routing"),
    ("nemotron_h_moe", {"num_experts_per_tok": 5}, "exceeds n_routed_experts"),
    ("granitehybrid", {"position_embedding_type": "rope"}, "position_embedding_type"),
    ("granitehybrid", {"mamba_expand": 3}, "mamba_expand"),
    ("granitehybrid", {"shared_intermediate_size": 96}, "has shape"),
])
def test_bad_config_gives_clear_error(models, tmp_path, name, changes, needle):
    d = hf_tiny.edited(models[name][0], str(tmp_path / "hf"), changes)
    with pytest.raises(ConvertError, match=needle):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)
