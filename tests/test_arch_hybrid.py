"""Hybrid models (issue 44): Qwen3.5 dense (gated DeltaNet layers beside gated attention), and Qwen3.5-MoE
and Qwen3-Next (the same layers with mixtures of experts) converted by ember-convert from tiny random
transformers models: the GGUF keys and tensors as llama.cpp's converter writes them (Qwen3.5's v heads
tiled, ssm_a = -exp(A_log), (1 + w) norms summed, stacked experts), ember's logits against
transformers' at f32 (one batch, token by token, a prompt continued on the recurrent state, and one
that does not extend what the state saw, which is recomputed), the engine's state slots, and the errors
for bad files and configs."""
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to read converted files")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402
from hf_tiny import hf_reference  # noqa: E402,F401 (a fixture)

import ember  # noqa: E402
from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

PROMPT = hf_tiny.LONG_PROMPT
# qwen35: DeltaNet layers 0, 1, 3 and gated attention in layer 2, 2 k heads and 4 v heads of 16;
# qwen35-narrow-v: a DeltaNet layer with v heads of 8 and an attention layer.
MODELS = ["qwen35", "qwen35-narrow-v"]
# Qwen3.5/3.6 MoE and Qwen3-Next: the same layers, each followed by routed experts beside a shared expert
# scaled by sigmoid(ffn_gate_inp_shexp . x). qwen35moe: DeltaNet layers 0, 1, 3 and gated attention in
# layer 2; qwen3next: DeltaNet layers 0 and 2, attention in layer 1, its v heads grouped by k head. Both:
# 2 k heads and 4 v heads of 16, 4 experts of 32 (top 2), a shared expert of 48.
MOE_MODELS = ["qwen35moe", "qwen3next"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_tiny.converted(tmp_path_factory, MODELS, "hybrid")


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    return hf_tiny.converted(tmp_path_factory, MOE_MODELS, "hybrid_moe")


# ------------------------------------------------------------------------------------- the file


def test_qwen35_file(models):
    hf_dir, sd, path = models["qwen35"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "qwen35."
    assert kv["general.architecture"] == "qwen35"
    assert kv[a + "block_count"] == 4 and kv[a + "attention.key_length"] == 16
    assert kv[a + "ssm.conv_kernel"] == 4 and kv[a + "ssm.state_size"] == 16 and kv[a + "ssm.group_count"] == 2
    assert kv[a + "ssm.time_step_rank"] == 4 and kv[a + "ssm.inner_size"] == 64
    assert list(kv[a + "attention.recurrent_layers"]) == [True, True, False, True]
    assert kv[a + "full_attention_interval"] == 4
    assert kv[a + "rope.dimension_count"] == 8 and list(kv[a + "rope.dimension_sections"]) == [2, 1, 1, 0]
    # A DeltaNet layer has no attention projections; the attention layer's q carries its gate.
    assert "blk.0.attn_q.weight" not in t and "blk.2.attn_qkv.weight" not in t
    assert t["blk.2.attn_q.weight"].shape == (2 * 4 * 16, 64)
    # (1 + w) norms are stored as the sum; the gated norm of the DeltaNet output is not.
    np.testing.assert_array_equal(t["blk.0.attn_norm.weight"], sd["model.layers.0.input_layernorm.weight"] + 1)
    np.testing.assert_array_equal(t["blk.2.attn_q_norm.weight"], sd["model.layers.2.self_attn.q_norm.weight"] + 1)
    np.testing.assert_array_equal(t["output_norm.weight"], sd["model.norm.weight"] + 1)
    np.testing.assert_array_equal(t["blk.0.ssm_norm.weight"], sd["model.layers.0.linear_attn.norm.weight"])
    # v heads grouped by k head (k0: v0 v1, k1: v2 v3) become tiled (v0 v2 v1 v3).
    order = [0, 2, 1, 3]
    la = "model.layers.1.linear_attn."
    np.testing.assert_array_equal(t["blk.1.ssm_dt.bias"], sd[la + "dt_bias"][order])
    np.testing.assert_allclose(t["blk.1.ssm_a"], -np.exp(sd[la + "A_log"][order]), rtol=1e-6)
    np.testing.assert_array_equal(t["blk.1.ssm_alpha.weight"], sd[la + "in_proj_a.weight"][order])
    z = sd[la + "in_proj_z.weight"].reshape(4, 16, 64)[order].reshape(64, 64)
    np.testing.assert_array_equal(t["blk.1.attn_gate.weight"], z)
    qkv, conv = sd[la + "in_proj_qkv.weight"], sd[la + "conv1d.weight"][:, 0, :]
    np.testing.assert_array_equal(t["blk.1.attn_qkv.weight"][:64], qkv[:64])
    np.testing.assert_array_equal(t["blk.1.attn_qkv.weight"][64:], qkv[64:].reshape(4, 16, 64)[order].reshape(64, 64))
    assert t["blk.1.ssm_conv1d.weight"].shape == (128, 4)
    np.testing.assert_array_equal(t["blk.1.ssm_conv1d.weight"][64:], conv[64:].reshape(4, 16, 4)[order].reshape(64, 4))
    out = sd[la + "out_proj.weight"].reshape(64, 4, 16)[:, order].reshape(64, 64)
    np.testing.assert_array_equal(t["blk.1.ssm_out.weight"], out)
    # The convolution stays f32 at any outtype, as llama.cpp keeps it.
    f16 = str(os.path.dirname(path) + "/qwen35-f16.gguf")
    convert(hf_dir, f16, "f16", progress=False)
    types = {x.name: x.tensor_type for x in gguf.GGUFReader(f16).tensors}
    assert types["blk.1.ssm_conv1d.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.1.attn_qkv.weight"] == gguf.GGMLQuantizationType.F16


# ------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", MODELS + MOE_MODELS)
@pytest.mark.parametrize("chunk", [64, 1, 7])
def test_logits_match_transformers(models, moe_models, hf_reference, name, chunk):
    """One batch, token by token, and chunks of 7 carrying the state between them."""
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits({**models, **moe_models}[name][2], PROMPT, chunk=chunk)
    rel = hf_tiny.rel_diff(got, want)
    assert rel <= 1e-4, f"{name} chunk {chunk}: max|diff|/max|ref| = {rel:.2e}"


def test_prompt_continued_on_the_state(models, hf_reference):
    """A prompt evaluated after a prefix the context holds reads the prefix's recurrent state."""
    want = hf_reference.logits("qwen35", PROMPT)
    ctx = hf_tiny.cpu_context(models["qwen35"][2])
    first = hf_tiny.eval_rows(ctx, PROMPT[:17])
    ctx.truncate(17)   # as many tokens as the state saw: nothing to redo
    rest = hf_tiny.eval_rows(ctx, PROMPT[17:])
    assert ctx.n_past == len(PROMPT)
    assert hf_tiny.rel_diff(np.concatenate([first, rest]), want) <= 1e-4


def test_prompt_that_does_not_extend_the_state_is_recomputed(models, hf_reference):
    """Cutting the context below what the recurrent state saw re-evaluates the kept tokens, so the
    new prompt's logits are as if the context had never held the old one."""
    want = hf_reference.logits("qwen35", PROMPT)
    rng = np.random.default_rng()
    other = PROMPT[:11] + [int(x) for x in rng.integers(3, 390, size=20)]
    ctx = hf_tiny.cpu_context(models["qwen35"][2], n_batch=8)
    hf_tiny.eval_rows(ctx, other)
    ctx.truncate(11)
    assert ctx.n_past == 11
    got = hf_tiny.eval_rows(ctx, PROMPT[11:])
    assert hf_tiny.rel_diff(got, want[11:]) <= 1e-4


def test_llama_prefix_reuse(models, hf_reference):
    """Llama's prompts: one extending what the context holds, then one diverging from it, then one
    equal to it (its last token is evaluated again, so the state is recomputed): each prompt's
    logits are transformers'."""
    want = hf_reference.logits("qwen35", PROMPT)
    llm = ember.Llama(models["qwen35"][2], n_ctx=64, n_threads=2, logits_all=True, type_k="f32", type_v="f32",
                      verbose=False)
    other = PROMPT[:25] + [7, 8, 9]
    for prompt in (PROMPT[:20], PROMPT, other, PROMPT, PROMPT):
        rows = llm._load_prompt(list(prompt), logits_all=True)
        if prompt is not other:
            assert hf_tiny.rel_diff(rows, want[:len(prompt)]) <= 1e-4


@pytest.mark.parametrize("interval", [0, 4, 8])
def test_a_cut_resumes_from_the_last_snapshot(models, hf_reference, interval):
    """With the recurrent state kept every `interval` tokens, a cut resumes from the last copy at or
    before it and evaluates only the tokens after that copy again; the logits are transformers' all
    the same, and the same as without snapshots."""
    want = hf_reference.logits("qwen35", PROMPT)
    rng = np.random.default_rng()
    cut = int(rng.integers(9, 24))
    other = PROMPT[:cut] + [int(x) for x in rng.integers(3, 390, size=12)]
    m = _ember.Model(models["qwen35"][2], n_gpu_layers=0)
    ctx = _ember.Context(m, n_ctx=64, n_batch=64, n_threads=2, type_k="f32", type_v="f32",
                         state_snapshot_interval=interval)
    hf_tiny.eval_rows(ctx, other)
    before = ctx.n_evaluated
    ctx.truncate(cut)
    resumed = cut // interval * interval if interval else 0
    assert ctx.n_past == cut and ctx.n_evaluated - before == cut - resumed
    assert hf_tiny.rel_diff(hf_tiny.eval_rows(ctx, PROMPT[cut:]), want[cut:]) <= 1e-4


def test_llama_resumes_a_shared_prefix_from_a_snapshot(models, hf_reference):
    """Llama's second prompt sharing a long prefix with the first evaluates the tokens after the
    prefix's last snapshot only, and gives the logits and greedy tokens of a fresh context."""
    want = hf_reference.logits("qwen35", PROMPT)
    kw = dict(n_ctx=96, n_threads=2, logits_all=True, type_k="f32", type_v="f32", verbose=False)
    llm = ember.Llama(models["qwen35"][2], state_snapshot_interval=8, **kw)
    first = PROMPT + [5, 6, 7]
    llm._load_prompt(list(first), logits_all=True)
    before = llm._ctx.n_evaluated
    rows = llm._load_prompt(list(PROMPT), logits_all=True)
    assert llm._ctx.n_evaluated - before <= 8
    assert hf_tiny.rel_diff(rows, want) <= 1e-4
    fresh = ember.Llama(models["qwen35"][2], state_snapshot_interval=0, **kw)
    assert np.array_equal(np.argmax(rows, axis=1), np.argmax(fresh._load_prompt(list(PROMPT), logits_all=True), axis=1))


def test_snapshots_take_at_most_their_memory(models):
    """state_snapshot_mb 0 keeps none (every cut recomputes from the start); bad values are refused."""
    m = _ember.Model(models["qwen35"][2], n_gpu_layers=0)
    ctx = _ember.Context(m, n_ctx=64, n_batch=64, n_threads=2, state_snapshot_interval=4, state_snapshot_mb=0)
    ctx.eval(PROMPT[:20], logits_all=False)
    before = ctx.n_evaluated
    ctx.truncate(13)
    assert ctx.n_evaluated - before == 13
    for field, value in (("state_snapshot_interval", -1), ("state_snapshot_mb", -2)):
        with pytest.raises(ValueError, match=field):
            _ember.Context(m, n_ctx=64, **{field: value})


# ------------------------------------------------------------------------------------- refusals and bad input


@pytest.mark.parametrize("name", ["qwen35"] + MOE_MODELS)
def test_inside_an_engine_batch(models, moe_models, hf_reference, name):
    """The prompt's logprobs among other sequences' steps are transformers': each sequence runs on
    its own recurrent state slot (and its own routed experts)."""
    hf_tiny.check_inside_an_engine_batch({**models, **moe_models}[name][2], hf_reference, name, "cpu")


def test_engine_preempts_cancels_and_frees_every_slot(models):
    """A pool too small for every sequence: the newest are preempted and recomputed from their first
    token on a fresh slot, and each sequence's greedy tokens are those it has alone; a cancelled one
    gives its slot back. Afterwards every state slot is free and no KV block is in use."""
    path = models["qwen35"][2]
    m = _ember.Model(path, n_gpu_layers=0)
    engine = _ember.Engine(m, n_ctx=64, max_num_seqs=4, max_num_batched_tokens=32, n_threads=2, type_k="f32",
                           type_v="f32", kv_blocks=5, kv_block_size=16)
    rng = np.random.default_rng()
    prompts = [[1] + [int(t) for t in rng.integers(3, 390, size=int(n))] for n in rng.integers(8, 20, size=6)]
    # EOS ignored: a sequence the random model ends early would leave the pool room enough not to preempt
    ids = [engine.add_request(p, temperature=0.0, max_tokens=40, ignore_eos=True) for p in prompts]
    cancelled = engine.add_request(prompts[0], temperature=0.0, max_tokens=40, ignore_eos=True)
    tokens = {i: [] for i in ids}
    left = set(ids) | {cancelled}
    while left:
        for o in engine.poll(1.0):
            if o.request_id == cancelled:
                engine.cancel(cancelled)
            else:
                tokens[o.request_id] += o.token_ids
            if o.finished:
                left.discard(o.request_id)
    stats = engine.stats()
    engine.close()
    assert stats["preemptions"] > 0
    assert stats["state_slots_total"] == 4 and stats["state_slots_free"] == 4 and stats["kv_blocks_used"] == 0
    alone = _ember.Engine(m, n_ctx=64, max_num_seqs=1, max_num_batched_tokens=32, n_threads=2, type_k="f32",
                          type_v="f32")
    for i, p in zip(ids, prompts):
        alone.add_request(p, temperature=0.0, max_tokens=40, ignore_eos=True)
        want, done = [], False
        while not done:
            for o in alone.poll(1.0):
                want += o.token_ids
                done = o.finished
        assert tokens[i] == want
    alone.close()


@pytest.mark.parametrize("name", MOE_MODELS)
def test_mixture_engine_preempts_and_every_sequence_keeps_its_tokens(moe_models, name):
    """The mixtures in a pool too small for every sequence: the newest are preempted and recomputed from their
    first token on a fresh state slot, each sequence's greedy tokens are those it has alone (its experts routed
    by its own rows), and afterwards every slot and block is free."""
    hf_tiny.check_engine_preemption(moe_models[name][2])


@pytest.mark.parametrize("name,interval", [("qwen35", 16), ("qwen35", 32), ("qwen35moe", 16), ("qwen3next", 32)])
def test_engine_resumes_a_cached_prefix_from_its_kept_state(models, moe_models, hf_reference, name, interval):
    """The engine keeps each sequence's recurrent state every `interval` tokens: a second request
    sharing a prefix with the first is served from the cache up to the last kept state in it (the
    tokens after are computed), with the greedy tokens of an engine that caches nothing, and its
    tokens' logprobs are transformers'."""
    m = _ember.Model({**models, **moe_models}[name][2], n_gpu_layers=0)
    kw = dict(n_ctx=96, max_num_seqs=2, max_num_batched_tokens=64, n_threads=2, type_k="f32", type_v="f32",
              kv_block_size=16)
    engine = _ember.Engine(m, state_snapshot_interval=interval, **kw)
    plain = _ember.Engine(m, enable_prefix_caching=False, **kw)
    rng = np.random.default_rng()
    first = PROMPT[:36] + [int(t) for t in rng.integers(3, 390, size=6)]
    hf_tiny.engine_greedy(engine, first, max_tokens=4)
    before = engine.stats()["cached_prompt_tokens"]
    second = PROMPT[:36] + [int(t) for t in rng.integers(3, 390, size=5)]
    got, _ = hf_tiny.engine_greedy(engine, second, max_tokens=6)
    assert engine.stats()["cached_prompt_tokens"] - before == 36 // interval * interval
    assert got == hf_tiny.engine_greedy(plain, second, max_tokens=6)[0]
    _, lps = hf_tiny.engine_greedy(engine, PROMPT, max_tokens=1, prompt_logprobs=True)
    want = hf_tiny.log_softmax(hf_reference.logits(name, PROMPT))
    assert np.allclose(lps, [want[i, PROMPT[i + 1]] for i in range(len(PROMPT) - 1)], atol=1e-4)
    engine.close()
    plain.close()


def test_engine_snapshot_interval_must_be_whole_blocks(models):
    m = _ember.Model(models["qwen35"][2], n_gpu_layers=0)
    with pytest.raises(ValueError, match="multiple of kv_block_size"):
        _ember.Engine(m, n_ctx=64, max_num_seqs=2, kv_block_size=16, state_snapshot_interval=24)


@pytest.mark.parametrize("fields", hf_tiny.GPU_PLACEMENTS, ids=["one-layer", "all", "override"])
@pytest.mark.parametrize("name", ["qwen35"] + MOE_MODELS)
def test_gpu_placement_is_taken(models, moe_models, name, fields):
    """The DeltaNet and gated attention layers run on backend ops only: any GPU placement is planned."""
    hf_tiny.check_gpu_placement_taken({**models, **moe_models}[name][2], fields)


@pytest.mark.parametrize("chunk", [64, 1], ids=["batch", "token_by_token"])
@pytest.mark.parametrize("name", MODELS + MOE_MODELS)
def test_cuda_logits_match_cpu(models, moe_models, name, chunk):
    """Every block on the GPU (the DeltaNet layers' convolution, gates and delta rule on their state
    slots in GPU memory; the gated attention; the mixtures) against the CPU, both with the f16 KV cache."""
    hf_tiny.check_cuda_logits_match_cpu({**models, **moe_models}[name][2], PROMPT, chunk)


@pytest.mark.parametrize("name", ["qwen35"] + MOE_MODELS)
def test_cuda_inside_an_engine_batch(models, moe_models, hf_reference, name):
    """On the GPU, the prompt's logprobs among other sequences' steps are the CPU's at the same f16 cache:
    each sequence's runs of tokens update its own state slot in GPU memory."""
    hf_tiny.check_inside_an_engine_batch({**models, **moe_models}[name][2], hf_reference, name, "cuda")


@pytest.mark.parametrize("drop,fields,needles", [
    (("blk.1.ssm_a",), {}, ["blk.1.ssm_a"]),
    (("blk.3.ssm_conv1d.weight",), {}, ["blk.3.ssm_conv1d.weight"]),
    (("blk.2.attn_q_norm.weight",), {}, ["blk.2.attn_q_norm.weight"]),
    ((), {"qwen35.ssm.group_count": 3}, ["group_count", "multiple"]),
    ((), {"qwen35.ssm.state_size": 8}, ["blk.0.attn_qkv.weight", "has shape"]),
    ((), {"qwen35.nextn_predict_layers": 4}, ["nextn_predict_layers 4"]),
])
def test_bad_file_gives_clear_error(models, tmp_path, drop, fields, needles):
    bad = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(models["qwen35"][2], bad, drop, fields)
    with pytest.raises(Exception) as e:
        _ember.Model(bad, n_gpu_layers=0)
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_multi_token_prediction_block_is_loaded_not_run(models, hf_reference, tmp_path):
    """A file with Qwen3.5's MTP block after the trunk (block_count + 1, nextn_predict_layers 1, the
    block's tensors in llama.cpp's names) loads, and the trunk's logits are unchanged."""
    rng = np.random.default_rng()
    E, D, V = 64, 16, hf_reference.logits("qwen35", PROMPT).shape[1]
    shapes = {"attn_norm.weight": (E,), "post_attention_norm.weight": (E,), "attn_q.weight": (2 * 4 * D, E),
              "attn_k.weight": (2 * D, E), "attn_v.weight": (2 * D, E), "attn_output.weight": (E, 4 * D),
              "attn_q_norm.weight": (D,), "attn_k_norm.weight": (D,), "ffn_gate.weight": (160, E),
              "ffn_up.weight": (160, E), "ffn_down.weight": (E, 160), "nextn.eh_proj.weight": (E, 2 * E),
              "nextn.enorm.weight": (E,), "nextn.hnorm.weight": (E,), "nextn.shared_head_norm.weight": (E,),
              "nextn.shared_head_head.weight": (V, E)}
    extra = [(f"blk.4.{n}", (0.1 * rng.standard_normal(s)).astype(np.float32)) for n, s in shapes.items()]
    path = str(tmp_path / "mtp.gguf")
    layers = {"qwen35.block_count": 5, "qwen35.nextn_predict_layers": 1,
              "qwen35.attention.recurrent_layers": [True, True, False, True, False]}
    hf_tiny.rewritten_gguf(models["qwen35"][2], path, fields=layers, extra=extra)
    got = hf_tiny.ember_logits(path, PROMPT)
    assert hf_tiny.rel_diff(got, hf_reference.logits("qwen35", PROMPT)) <= 1e-4


def _mtp_checkpoint_tensors(mlp):
    """Random mtp.* tensors of a tiny model's MTP head: its block of one gated attention and the
    feed-forward or mixture `mlp` (checkpoint name -> shape)."""
    E, D = 64, 16
    shapes = {"mtp.fc.weight": (E, 2 * E), "mtp.pre_fc_norm_embedding.weight": (E,),
              "mtp.pre_fc_norm_hidden.weight": (E,), "mtp.norm.weight": (E,)}
    layer = {"input_layernorm.weight": (E,), "post_attention_layernorm.weight": (E,),
             "self_attn.q_proj.weight": (2 * 4 * D, E), "self_attn.k_proj.weight": (2 * D, E),
             "self_attn.v_proj.weight": (2 * D, E), "self_attn.o_proj.weight": (E, 4 * D),
             "self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,), **mlp}
    shapes.update({"mtp.layers.0." + n: s for n, s in layer.items()})
    rng = np.random.default_rng()
    return {n: (0.1 * rng.standard_normal(s)).astype(np.float32) for n, s in shapes.items()}


def test_checkpoint_with_a_multi_token_prediction_block(models, hf_reference, tmp_path):
    """mtp_num_hidden_layers 1 and the mtp.* tensors: the block after the trunk, in llama.cpp's names
    (its (1 + w) norms summed), nextn_predict_layers 1, and the trunk's logits unchanged."""
    E = 64
    mtp = _mtp_checkpoint_tensors({"mlp.gate_proj.weight": (160, E), "mlp.up_proj.weight": (160, E),
                                   "mlp.down_proj.weight": (E, 160)})
    d = _with_config(models, tmp_path, mtp_num_hidden_layers=1)
    hf_tiny._write_safetensors(os.path.join(d, "mtp.safetensors"), mtp, "float32")
    path = str(tmp_path / "mtp.gguf")
    convert(d, path, "f32", progress=False)
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert kv["qwen35.block_count"] == 5 and kv["qwen35.nextn_predict_layers"] == 1
    assert list(kv["qwen35.attention.recurrent_layers"]) == [True, True, False, True, False]
    np.testing.assert_array_equal(t["blk.4.nextn.eh_proj.weight"], mtp["mtp.fc.weight"])
    np.testing.assert_array_equal(t["blk.4.nextn.enorm.weight"], mtp["mtp.pre_fc_norm_embedding.weight"] + 1)
    np.testing.assert_array_equal(t["blk.4.nextn.hnorm.weight"], mtp["mtp.pre_fc_norm_hidden.weight"] + 1)
    np.testing.assert_array_equal(t["blk.4.nextn.shared_head_norm.weight"], mtp["mtp.norm.weight"] + 1)
    np.testing.assert_array_equal(t["blk.4.attn_norm.weight"], mtp["mtp.layers.0.input_layernorm.weight"] + 1)
    np.testing.assert_array_equal(t["blk.4.attn_q.weight"], mtp["mtp.layers.0.self_attn.q_proj.weight"])
    assert "blk.4.attn_qkv.weight" not in t
    got = hf_tiny.ember_logits(path, PROMPT)
    assert hf_tiny.rel_diff(got, hf_reference.logits("qwen35", PROMPT)) <= 1e-4


def test_recurrent_layers_list_must_cover_every_block(models, tmp_path):
    bad = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(models["qwen35"][2], bad, fields={"qwen35.attention.recurrent_layers": [True, False]})
    with pytest.raises(Exception, match="recurrent_layers must be 4 bools"):
        _ember.Model(bad, n_gpu_layers=0)


def _with_config(models, tmp_path, **changes):
    return hf_tiny.edited(models["qwen35"][0], str(tmp_path / "hf"), changes)


@pytest.mark.parametrize("changes,needle", [
    ({"linear_num_value_heads": 3}, "not a multiple of linear_num_key_heads"),
    ({"layer_types": ["linear_attention", "mamba", "full_attention", "linear_attention"]}, "unknown layer type"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "'layer_types' has 2 entries"),
    ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
    ({"mtp_num_hidden_layers": 1}, "missing tensor mtp.layers.0."),
    ({"mtp_num_hidden_layers": -1}, "mtp_num_hidden_layers"),
])
def test_bad_config_gives_clear_error(models, tmp_path, changes, needle):
    d = _with_config(models, tmp_path, **changes)
    with pytest.raises(ConvertError, match=needle):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)


# ------------------------------------------------------------------------------------- mixtures


def _check_mixture(kv, t, sd, arch, layers):
    a = arch + "."
    assert kv[a + "expert_count"] == 4 and kv[a + "expert_used_count"] == 2
    assert kv[a + "expert_feed_forward_length"] == 32 and kv[a + "expert_shared_feed_forward_length"] == 48
    for i in layers:
        p, b = f"model.layers.{i}.mlp.", f"blk.{i}."
        np.testing.assert_array_equal(t[b + "ffn_gate_inp.weight"], sd[p + "gate.weight"])
        for kind in ("gate", "up", "down"):
            want = np.stack([sd[f"{p}experts.{e}.{kind}_proj.weight"] for e in range(4)])
            np.testing.assert_array_equal(t[f"{b}ffn_{kind}_exps.weight"], want)
            np.testing.assert_array_equal(t[f"{b}ffn_{kind}_shexp.weight"], sd[f"{p}shared_expert.{kind}_proj.weight"])
        # The shared expert's gate as llama.cpp writes it: the checkpoint's [1][n_embd] matrix.
        np.testing.assert_array_equal(t[b + "ffn_gate_inp_shexp.weight"], sd[p + "shared_expert_gate.weight"])
        assert b + "ffn_gate.weight" not in t


def test_qwen35moe_file(moe_models):
    _, sd, path = moe_models["qwen35moe"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert kv["general.architecture"] == "qwen35moe"
    assert list(kv["qwen35moe.attention.recurrent_layers"]) == [True, True, False, True]
    assert list(kv["qwen35moe.rope.dimension_sections"]) == [2, 1, 1, 0]
    _check_mixture(kv, t, sd, "qwen35moe", range(4))
    # Qwen3.5's DeltaNet layout: v heads tiled, beta and alpha apart.
    order = [0, 2, 1, 3]
    la = "model.layers.1.linear_attn."
    np.testing.assert_array_equal(t["blk.1.ssm_beta.weight"], sd[la + "in_proj_b.weight"][order])
    np.testing.assert_array_equal(t["blk.1.attn_norm.weight"], sd["model.layers.1.input_layernorm.weight"] + 1)


def test_qwen3next_file(moe_models):
    _, sd, path = moe_models["qwen3next"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "qwen3next."
    assert kv["general.architecture"] == "qwen3next"
    assert list(kv[a + "attention.recurrent_layers"]) == [True, False, True]
    assert kv[a + "rope.dimension_count"] == 8 and a + "rope.dimension_sections" not in kv
    assert kv[a + "ssm.group_count"] == 2 and kv[a + "ssm.time_step_rank"] == 4 and kv[a + "ssm.inner_size"] == 64
    _check_mixture(kv, t, sd, "qwen3next", range(3))
    # in_proj_qkvz keeps per k head [q 16, k 16, v 2x16, z 2x16]: split into every head's q, k, v (v heads
    # still grouped by k head) and z; in_proj_ba is kept whole, v heads not reordered.
    la = "model.layers.2.linear_attn."
    qkvz = sd[la + "in_proj_qkvz.weight"].reshape(2, 96, 64)
    q, k, v, z = qkvz[:, :16], qkvz[:, 16:32], qkvz[:, 32:64], qkvz[:, 64:]
    want = np.concatenate([x.reshape(-1, 64) for x in (q, k, v)])
    np.testing.assert_array_equal(t["blk.2.attn_qkv.weight"], want)
    np.testing.assert_array_equal(t["blk.2.attn_gate.weight"], z.reshape(-1, 64))
    np.testing.assert_array_equal(t["blk.2.ssm_ba.weight"], sd[la + "in_proj_ba.weight"])
    np.testing.assert_array_equal(t["blk.2.ssm_dt.bias"], sd[la + "dt_bias"])
    np.testing.assert_allclose(t["blk.2.ssm_a"], -np.exp(sd[la + "A_log"]), rtol=1e-6)
    np.testing.assert_array_equal(t["blk.2.ssm_conv1d.weight"], sd[la + "conv1d.weight"][:, 0, :])
    np.testing.assert_array_equal(t["blk.2.ssm_out.weight"], sd[la + "out_proj.weight"])
    np.testing.assert_array_equal(t["blk.2.ssm_norm.weight"], sd[la + "norm.weight"])
    np.testing.assert_array_equal(t["blk.1.attn_q_norm.weight"], sd["model.layers.1.self_attn.q_norm.weight"] + 1)
    for n in ("blk.2.ssm_beta.weight", "blk.2.ssm_alpha.weight", "blk.2.ssm_in.weight"):
        assert n not in t


# ------------------------------------------------------------------------------------- logits


# ------------------------------------------------------------------------------------- MTP


# Qwen3.5-MoE's config says mtp_num_hidden_layers; Qwen3-Next's leaves it out and its checkpoint's blocks count.
@pytest.mark.parametrize("name,config,n_layer", [("qwen35moe", {"mtp_num_hidden_layers": 1}, 4),
                                                 ("qwen3next", {}, 3)])
def test_mixture_checkpoint_with_a_multi_token_prediction_block(moe_models, hf_reference, tmp_path, name, config,
                                                                n_layer):
    """The mtp.* tensors (a mixture block of their own): the block after the trunk in llama.cpp's names,
    nextn_predict_layers 1; the file loads and the trunk's logits are unchanged."""
    E = 64
    mlp = {"mlp.gate.weight": (4, E), "mlp.shared_expert.gate_proj.weight": (48, E),
           "mlp.shared_expert.up_proj.weight": (48, E), "mlp.shared_expert.down_proj.weight": (E, 48),
           "mlp.shared_expert_gate.weight": (1, E)}
    for e in range(4):
        mlp.update({f"mlp.experts.{e}.gate_proj.weight": (32, E), f"mlp.experts.{e}.up_proj.weight": (32, E),
                    f"mlp.experts.{e}.down_proj.weight": (E, 32)})
    mtp = _mtp_checkpoint_tensors(mlp)
    d = hf_tiny.edited(moe_models[name][0], str(tmp_path / "hf"), config)
    hf_tiny._write_safetensors(os.path.join(d, "mtp.safetensors"), mtp, "float32")
    path = str(tmp_path / "mtp.gguf")
    convert(d, path, "f32", progress=False)
    kv, t, b = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path), f"blk.{n_layer}."
    assert kv[name + ".block_count"] == n_layer + 1 and kv[name + ".nextn_predict_layers"] == 1
    assert list(kv[name + ".attention.recurrent_layers"])[-1] is False
    np.testing.assert_array_equal(t[b + "nextn.eh_proj.weight"], mtp["mtp.fc.weight"])
    np.testing.assert_array_equal(t[b + "nextn.shared_head_norm.weight"], mtp["mtp.norm.weight"] + 1)
    want = np.stack([mtp[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] for e in range(4)])
    np.testing.assert_array_equal(t[b + "ffn_up_exps.weight"], want)
    shared_gate = mtp["mtp.layers.0.mlp.shared_expert_gate.weight"]
    np.testing.assert_array_equal(t[b + "ffn_gate_inp_shexp.weight"], shared_gate)
    got = hf_tiny.ember_logits(path, PROMPT)
    assert hf_tiny.rel_diff(got, hf_reference.logits(name, PROMPT)) <= 1e-4


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name,drop,fields,needles", [
    ("qwen35moe", ("blk.1.ffn_gate_inp_shexp.weight",), {}, ["blk.1.ffn_gate_inp_shexp.weight"]),
    ("qwen35moe", ("blk.2.ffn_down_exps.weight",), {}, ["blk.2.ffn_down_exps.weight"]),
    ("qwen35moe", (), {"qwen35moe.expert_shared_feed_forward_length": 40}, ["ffn_gate_shexp.weight", "has shape"]),
    ("qwen3next", ("blk.0.ssm_ba.weight",), {}, ["blk.0.ssm_ba.weight"]),
    ("qwen3next", ("blk.1.ffn_up_shexp.weight",), {}, ["blk.1.ffn_up_shexp.weight"]),
    ("qwen3next", (), {"qwen3next.expert_count": 0}, ["expert_count"]),
])
def test_mixture_bad_file_gives_clear_error(moe_models, tmp_path, name, drop, fields, needles):
    bad = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(moe_models[name][2], bad, drop, fields)
    with pytest.raises(Exception) as e:
        _ember.Model(bad, n_gpu_layers=0)
    for n in needles:
        assert n in str(e.value), str(e.value)


def _without_tensor(src, dst, name, weights):
    d = hf_tiny.edited(src, dst, {})
    os.remove(os.path.join(d, "model.safetensors"))
    hf_tiny._write_safetensors(os.path.join(d, "model.safetensors"),
                               {n: w for n, w in weights.items() if n != name}, "float32")
    return d


@pytest.mark.parametrize("name,changes,needle", [
    ("qwen35moe", {"shared_expert_intermediate_size": None}, "shared_expert_intermediate_size"),
    ("qwen35moe", {"num_experts_per_tok": 5}, "exceeds num_experts"),
    ("qwen3next", {"mlp_only_layers": [1]}, "mlp_only_layers"),
    ("qwen3next", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("qwen3next", {"norm_topk_prob": False}, "norm_topk_prob"),
    ("qwen3next", {"linear_num_value_heads": 3}, "not a multiple of linear_num_key_heads"),
])
def test_mixture_bad_config_gives_clear_error(moe_models, tmp_path, name, changes, needle):
    d = hf_tiny.edited(moe_models[name][0], str(tmp_path / "hf"), changes)
    with pytest.raises(ConvertError, match=needle):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)


@pytest.mark.parametrize("name,tensor", [("qwen35moe", "model.layers.3.mlp.shared_expert_gate.weight"),
                                         ("qwen3next", "model.layers.0.linear_attn.in_proj_ba.weight"),
                                         ("qwen3next", "model.layers.2.mlp.experts.3.down_proj.weight")])
def test_mixture_missing_checkpoint_tensor_is_named(moe_models, tmp_path, name, tensor):
    src, weights, _ = moe_models[name]
    d = _without_tensor(src, str(tmp_path / "hf"), tensor, weights)
    with pytest.raises(ConvertError, match=f"missing tensor {tensor}"):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)


@pytest.mark.parametrize("name,arch", [("qwen35", "Qwen3_5ForConditionalGeneration"),
                                       ("qwen35moe", "Qwen3_5MoeForConditionalGeneration")])
def test_released_multimodal_checkpoint_converts_its_text_model(models, moe_models, hf_reference, tmp_path, name,
                                                                arch):
    """Qwen3.5 / 3.6 as released: the text model under model.language_model. beside a vision tower
    (model.visual.*, not converted) and a config whose text_config describes it: the text model's file."""
    src, weights, text_path = {**models, **moe_models}[name]
    d = hf_tiny.edited(src, str(tmp_path / "hf"), lambda c: c.update(
        {"architectures": [arch], "text_config": {k: v for k, v in c.items() if k != "architectures"}}))
    os.remove(os.path.join(d, "model.safetensors"))
    renamed = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): w
               for n, w in weights.items()}
    renamed["model.visual.patch_embed.proj.weight"] = np.random.default_rng().standard_normal((8, 4), np.float32)
    hf_tiny._write_safetensors(os.path.join(d, "model.safetensors"), renamed, "float32")
    path = str(tmp_path / "mm.gguf")
    convert(d, path, "f32", progress=False)
    got, want = hf_tiny.gguf_tensors(path), hf_tiny.gguf_tensors(text_path)
    assert sorted(got) == sorted(want)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n])
    assert hf_tiny.rel_diff(hf_tiny.ember_logits(path, PROMPT), hf_reference.logits(name, PROMPT)) <= 1e-4
