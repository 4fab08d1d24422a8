"""LFM2 and LFM2-MoE (issue 44): short-convolution layers beside GQA attention layers with q/k norms, converted by
ember-convert from tiny random transformers models: the GGUF keys and tensors as llama.cpp's converter
writes them (head_count_kv one a layer, 0 for a convolution layer; the squeezed convolution; the final
norm as token_embd_norm), ember's logits against transformers' at f32 (one batch, token by token, a
prompt continued on the convolution state, one cut below it), the engine's state slots (inside a batch,
across preemption, a cached prefix), and the errors for bad files and configs."""
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
# lfm2: convolution layers 0, 1 and 3 (length 3) around attention in layer 2, a tied head;
# lfm2-untied: attention in layer 0, a convolution of length 4 in layer 1, an untied head;
# lfm2moe: a dense layer 0, then mixtures of 4 experts (top 2, sigmoid scores plus the expert bias).
MODELS = ["lfm2", "lfm2-untied", "lfm2moe"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_tiny.converted(tmp_path_factory, MODELS, "lfm2")


# ------------------------------------------------------------------------------------- the file


def test_lfm2_file(models):
    hf_dir, sd, path = models["lfm2"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "lfm2."
    assert kv["general.architecture"] == "lfm2"
    assert kv[a + "block_count"] == 4 and kv[a + "shortconv.l_cache"] == 3
    assert list(kv[a + "attention.head_count_kv"]) == [0, 0, 2, 0]
    # block_auto_adjust_ff_dim: 2/3 of intermediate_size 160, rounded up to block_multiple_of 32.
    assert kv[a + "feed_forward_length"] == 128 and t["blk.0.ffn_gate.weight"].shape == (128, 64)
    assert kv[a + "attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    # The final norm is token_embd_norm, the head tied to token_embd.
    np.testing.assert_array_equal(t["token_embd_norm.weight"], sd["model.embedding_norm.weight"])
    assert "output_norm.weight" not in t and "output.weight" not in t
    # A convolution layer has no attention tensors; the attention layer no convolution.
    assert "blk.0.attn_q.weight" not in t and "blk.2.shortconv.in_proj.weight" not in t
    np.testing.assert_array_equal(t["blk.1.shortconv.conv.weight"], sd["model.layers.1.conv.conv.weight"][:, 0, :])
    np.testing.assert_array_equal(t["blk.1.shortconv.in_proj.weight"], sd["model.layers.1.conv.in_proj.weight"])
    np.testing.assert_array_equal(t["blk.3.shortconv.out_proj.weight"], sd["model.layers.3.conv.out_proj.weight"])
    np.testing.assert_array_equal(t["blk.2.attn_q_norm.weight"], sd["model.layers.2.self_attn.q_layernorm.weight"])
    np.testing.assert_array_equal(t["blk.2.attn_output.weight"], sd["model.layers.2.self_attn.out_proj.weight"])
    np.testing.assert_array_equal(t["blk.0.attn_norm.weight"], sd["model.layers.0.operator_norm.weight"])
    np.testing.assert_array_equal(t["blk.0.ffn_up.weight"], sd["model.layers.0.feed_forward.w3.weight"])
    # The convolution stays f32 at any outtype, as llama.cpp keeps it.
    f16 = str(os.path.dirname(path) + "/lfm2-f16.gguf")
    convert(hf_dir, f16, "f16", progress=False)
    types = {x.name: x.tensor_type for x in gguf.GGUFReader(f16).tensors}
    assert types["blk.1.shortconv.conv.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.1.shortconv.in_proj.weight"] == gguf.GGMLQuantizationType.F16


def test_untied_file(models):
    _, sd, path = models["lfm2-untied"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert list(kv["lfm2.attention.head_count_kv"]) == [2, 0] and kv["lfm2.shortconv.l_cache"] == 4
    assert kv["lfm2.feed_forward_length"] == 160   # block_auto_adjust_ff_dim off
    np.testing.assert_array_equal(t["output.weight"], sd["lm_head.weight"])
    assert t["blk.1.shortconv.conv.weight"].shape == (64, 4)


def test_lfm2moe_file(models):
    _, sd, path = models["lfm2moe"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "lfm2moe."
    assert kv["general.architecture"] == "lfm2moe" and list(kv[a + "attention.head_count_kv"]) == [0, 2, 0, 0]
    assert kv[a + "expert_count"] == 4 and kv[a + "expert_used_count"] == 2
    assert kv[a + "expert_feed_forward_length"] == 32 and kv[a + "feed_forward_length"] == 160
    assert kv[a + "leading_dense_block_count"] == 1 and kv[a + "expert_gating_func"] == 2
    assert "blk.0.ffn_gate_inp.weight" not in t and "blk.1.ffn_gate.weight" not in t
    p = "model.layers.2.feed_forward."
    np.testing.assert_array_equal(t["blk.2.ffn_gate_inp.weight"], sd[p + "gate.weight"])
    np.testing.assert_array_equal(t["blk.2.exp_probs_b.bias"], sd[p + "expert_bias"])
    for kind, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
        want = np.stack([sd[f"{p}experts.{e}.{w}.weight"] for e in range(4)])
        np.testing.assert_array_equal(t[f"blk.2.ffn_{kind}_exps.weight"], want)
    assert t["blk.1.ffn_down_exps.weight"].shape == (4, 64, 32)


def test_older_config_spellings_convert_alike(models, tmp_path):
    """Released LFM2 configs spell intermediate_size block_ff_dim and tie_word_embeddings tie_embedding,
    and list the attention layers in full_attn_idxs: the same file comes out."""
    def older(cfg):
        cfg["block_ff_dim"] = cfg.pop("intermediate_size")
        cfg["tie_embedding"] = cfg.pop("tie_word_embeddings")
        cfg.pop("rms_norm_eps", None)
        cfg.pop("layer_types")
        cfg["full_attn_idxs"] = [2]

    d = hf_tiny.edited(models["lfm2"][0], str(tmp_path / "hf"), older)
    path = str(tmp_path / "older.gguf")
    convert(d, path, "f32", progress=False)
    want = hf_tiny.gguf_fields(models["lfm2"][2])
    got = hf_tiny.gguf_fields(path)
    for k in ("lfm2.attention.head_count_kv", "lfm2.feed_forward_length", "lfm2.attention.layer_norm_rms_epsilon"):
        assert np.array_equal(got[k], want[k]), k
    assert set(hf_tiny.gguf_tensors(path)) == set(hf_tiny.gguf_tensors(models["lfm2"][2]))


# ------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("chunk", [64, 1, 7])
def test_logits_match_transformers(models, hf_reference, name, chunk):
    """One batch, token by token, and chunks of 7 carrying the convolution state between them."""
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=chunk)
    rel = hf_tiny.rel_diff(got, want)
    assert rel <= 1e-4, f"{name} chunk {chunk}: max|diff|/max|ref| = {rel:.2e}"


@pytest.mark.parametrize("chunk", [64, 1], ids=["batch", "token_by_token"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (the gated short convolutions on their state slots in GPU memory, the
    attention, the mixture) against the CPU, both with the f16 KV cache."""
    hf_tiny.check_cuda_logits_match_cpu(models[name][2], PROMPT, chunk)


def test_prompt_continued_and_cut(models, hf_reference):
    """A prompt after a prefix the context holds reads the prefix's convolution state; cutting the
    context below what the state saw re-evaluates the kept tokens, so the next prompt's logits are
    as if the context had never held the other one."""
    want = hf_reference.logits("lfm2", PROMPT)
    ctx = hf_tiny.cpu_context(models["lfm2"][2], n_batch=8)
    first = hf_tiny.eval_rows(ctx, PROMPT[:17])
    assert hf_tiny.rel_diff(np.concatenate([first, hf_tiny.eval_rows(ctx, PROMPT[17:])]), want) <= 1e-4
    rng = np.random.default_rng()
    cut = int(rng.integers(5, 30))
    ctx.truncate(0)
    hf_tiny.eval_rows(ctx, PROMPT[:cut] + [int(x) for x in rng.integers(3, 390, size=9)])
    ctx.truncate(cut)
    assert ctx.n_past == cut
    assert hf_tiny.rel_diff(hf_tiny.eval_rows(ctx, PROMPT[cut:]), want[cut:]) <= 1e-4


# ------------------------------------------------------------------------------------- the engine


@pytest.mark.parametrize("name", ["lfm2", "lfm2moe"])
def test_inside_an_engine_batch(models, hf_reference, name):
    """The prompt's logprobs among other sequences' steps are transformers': each sequence runs on
    its own convolution state slot."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, "cpu")


@pytest.mark.parametrize("name", ["lfm2", "lfm2moe"])
def test_cuda_inside_an_engine_batch(models, hf_reference, name):
    """On the GPU, the prompt's logprobs among other sequences' steps are the CPU's at the same f16 cache:
    each sequence's runs of tokens update its own convolution state slot in GPU memory."""
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, "cuda")


def _generate(engine, prompts, cancel_one=None):
    ids = [engine.add_request(p, temperature=0.0, max_tokens=30) for p in prompts]
    cancelled = engine.add_request(cancel_one, temperature=0.0, max_tokens=30) if cancel_one else None
    tokens = {i: [] for i in ids}
    left = set(ids) | ({cancelled} if cancelled is not None else set())
    while left:
        for o in engine.poll(1.0):
            if o.request_id == cancelled:
                engine.cancel(cancelled)
            else:
                tokens[o.request_id] += o.token_ids
            if o.finished:
                left.discard(o.request_id)
    return [tokens[i] for i in ids]


def test_engine_preempts_cancels_and_frees_every_slot(models):
    """A pool too small for every sequence: the newest are preempted and recomputed on a fresh slot,
    each sequence's greedy tokens are those it has alone, a cancelled one gives its slot back, and
    afterwards every state slot is free and no KV block is in use."""
    m = _ember.Model(models["lfm2"][2], n_gpu_layers=0)
    kw = dict(n_ctx=64, max_num_batched_tokens=32, n_threads=2, type_k="f32", type_v="f32")
    engine = _ember.Engine(m, max_num_seqs=4, kv_blocks=4, kv_block_size=16, **kw)
    rng = np.random.default_rng()
    prompts = [[1] + [int(t) for t in rng.integers(3, 390, size=int(n))] for n in rng.integers(8, 20, size=6)]
    got = _generate(engine, prompts, cancel_one=prompts[0])
    stats = engine.stats()
    engine.close()
    assert stats["preemptions"] > 0
    assert stats["state_slots_total"] == 4 and stats["state_slots_free"] == 4 and stats["kv_blocks_used"] == 0
    alone = _ember.Engine(m, max_num_seqs=1, **kw)
    assert got == [_generate(alone, [p])[0] for p in prompts]
    alone.close()


def test_engine_resumes_a_cached_prefix(models, hf_reference):
    """A second request sharing a prefix with the first resumes from the state kept at the last
    block boundary in it, with the greedy tokens of an engine that caches nothing; and a prompt's
    logprobs after that are still transformers'."""
    m = _ember.Model(models["lfm2"][2], n_gpu_layers=0)
    kw = dict(n_ctx=96, max_num_seqs=2, max_num_batched_tokens=64, n_threads=2, type_k="f32", type_v="f32",
              kv_block_size=16)
    engine = _ember.Engine(m, state_snapshot_interval=16, **kw)
    plain = _ember.Engine(m, enable_prefix_caching=False, **kw)
    rng = np.random.default_rng()
    first = PROMPT[:36] + [int(t) for t in rng.integers(3, 390, size=6)]
    second = PROMPT[:36] + [int(t) for t in rng.integers(3, 390, size=5)]
    _generate(engine, [first])
    before = engine.stats()["cached_prompt_tokens"]
    assert _generate(engine, [second]) == _generate(plain, [second])
    assert engine.stats()["cached_prompt_tokens"] - before == 32
    rid = engine.add_request(PROMPT, temperature=0.0, max_tokens=1, prompt_logprobs=True)
    lps, done = [], False
    while not done:
        for o in engine.poll(1.0):
            assert o.request_id == rid
            lps += o.prompt_logprobs
            done = o.finished
    want = hf_tiny.log_softmax(hf_reference.logits("lfm2", PROMPT))
    assert np.allclose(lps, [want[i, PROMPT[i + 1]] for i in range(len(PROMPT) - 1)], atol=1e-4)
    engine.close()
    plain.close()


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("fields", hf_tiny.GPU_PLACEMENTS, ids=["one-layer", "all", "override"])
@pytest.mark.parametrize("name", ["lfm2", "lfm2moe"])
def test_gpu_placement_is_taken(models, name, fields):
    """The convolution layers run on backend ops only: any GPU placement is planned."""
    hf_tiny.check_gpu_placement_taken(models[name][2], fields)


@pytest.mark.parametrize("drop,fields,needles", [
    (("blk.1.shortconv.conv.weight",), {}, ["blk.1.shortconv.conv.weight"]),
    (("blk.3.shortconv.in_proj.weight",), {}, ["blk.3.shortconv.in_proj.weight"]),
    (("blk.2.attn_k_norm.weight",), {}, ["blk.2.attn_k_norm.weight"]),
    (("token_embd_norm.weight",), {}, ["token_embd_norm.weight"]),
    ((), {"lfm2.shortconv.l_cache": None}, ["lfm2.shortconv.l_cache"]),
    ((), {"lfm2.shortconv.l_cache": 1}, ["shortconv.l_cache must be at least 2"]),
    ((), {"lfm2.shortconv.l_cache": 4}, ["blk.0.shortconv.conv.weight", "shape"]),
    ((), {"lfm2.attention.head_count_kv": [0, 0, 0, 2]}, ["blk.2.shortconv.conv.weight"]),
    ((), {"lfm2.attention.head_count_kv": [0, 0, 0, 0]}, ["head_count_kv 0"]),
    ((), {"lfm2.attention.head_count_kv": [2, 0, 2, 0]}, ["blk.0.attn_q.weight"]),
    ((), {"lfm2.attention.sliding_window": 8}, ["sliding_window is not supported"]),
])
def test_bad_file_gives_clear_error(models, tmp_path, drop, fields, needles):
    _check_bad_file(models["lfm2"][2], tmp_path, drop, fields, needles)


@pytest.mark.parametrize("drop,fields,needles", [
    (("blk.3.exp_probs_b.bias",), {}, ["blk.3.exp_probs_b.bias"]),
    (("blk.1.ffn_up_exps.weight",), {}, ["blk.1.ffn_up_exps.weight"]),
    ((), {"lfm2moe.expert_gating_func": 1}, ["expert_gating_func 1 is not supported"]),
    ((), {"lfm2moe.expert_gating_func": None}, ["lfm2moe.expert_gating_func"]),
    ((), {"lfm2moe.leading_dense_block_count": 9}, ["leading_dense_block_count 9 exceeds block_count"]),
    ((), {"lfm2moe.leading_dense_block_count": 2}, ["blk.1.ffn_gate.weight"]),
    ((), {"lfm2moe.expert_count": None}, ["lfm2moe.expert_count"]),
])
def test_bad_moe_file_gives_clear_error(models, tmp_path, drop, fields, needles):
    _check_bad_file(models["lfm2moe"][2], tmp_path, drop, fields, needles)


def _check_bad_file(path, tmp_path, drop, fields, needles):
    bad = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(path, bad, drop, fields)
    with pytest.raises(Exception) as e:
        _ember.Model(bad, n_gpu_layers=0)
    for n in needles:
        assert n in str(e.value), str(e.value)


@pytest.mark.parametrize("changes,needle", [
    ({"conv_bias": True}, "conv_bias=true is not supported"),
    ({"layer_types": ["conv", "mamba", "full_attention", "conv"]}, "unknown layer type 'mamba'"),
    ({"layer_types": ["conv", "full_attention"]}, "'layer_types' must have num_hidden_layers=4 entries"),
    ({"conv_L_cache": 1}, "'conv_L_cache' must be an integer of at least 2"),
    ({"layer_types": None, "full_attn_idxs": [7]}, "'full_attn_idxs' must list layers below"),
    ({"layer_types": ["conv", "conv", "conv", "conv"]}, "unexpected tensor model.layers.2.self_attn"),
    ({"block_multiple_of": 0}, "'block_multiple_of' must be a positive integer"),
])
def test_bad_config_gives_clear_error(models, tmp_path, changes, needle):
    d = hf_tiny.edited(models["lfm2"][0], str(tmp_path / "hf"), changes)
    with pytest.raises(ConvertError, match=needle):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)


@pytest.mark.parametrize("changes,needle", [
    ({"use_expert_bias": False}, "use_expert_bias=False is not supported for lfm2moe"),
    ({"norm_topk_prob": False}, "norm_topk_prob=False is not supported"),
    ({"routed_scaling_factor": 2.5}, "routed_scaling_factor=2.5 is not supported"),
    ({"num_dense_layers": 5}, "'num_dense_layers' must be an integer from 0 to num_hidden_layers=4"),
    ({"num_dense_layers": 2}, "unexpected tensor model.layers.1.feed_forward"),
    ({"num_experts": None}, "missing key 'num_experts'"),
])
def test_bad_moe_config_gives_clear_error(models, tmp_path, changes, needle):
    d = hf_tiny.edited(models["lfm2moe"][0], str(tmp_path / "hf"), changes)
    with pytest.raises(ConvertError, match=needle):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)
