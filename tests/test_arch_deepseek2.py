"""DeepSeek V2 and V3 and GLM-4.7-Flash (deepseek2): tiny random transformers models converted by
ember-convert. The GGUF keys and tensors as llama.cpp's converter writes them (one KV head of kv_lora_rank +
rope, kv_b_proj split into attn_k_b / attn_v_b, the selection bias as exp_probs_b); ember's logits against
transformers' at f32 (one batch, token by token, inside an engine batch, from the prefix cache), with the
latent as the cache and the queries absorbed; V3's group-limited sigmoid routing and selection bias shown to
matter; the routing of files without expert_gating_func guessed as llama.cpp guesses it; on the GPU (every
block: the latent row as one KV head, group-limited routing on the device), and a latent row wider than the
GPU's attention heads refused at load; and the errors for bad files and configs."""
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
# deepseek-v3: 3 layers (the first dense), q_lora_rank 48, kv_lora_rank 32, heads of 16 + 8 rotated key
# dimensions and values of 24, 8 experts in 4 groups (2 chosen from), YaRN; deepseek-v2: 2 layers, plain
# queries, values of 16, softmax routing; glm-4.7-flash: Glm4MoeLiteForCausalLM, V3's attention, one group,
# the dense layer named by mlp_layer_types.
MODELS = ["deepseek-v3", "deepseek-v2", "glm-4.7-flash"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_tiny.converted(tmp_path_factory, MODELS, "deepseek2")


def _kv_b(sd, layer, nope, v_dim):
    return sd[f"model.layers.{layer}.self_attn.kv_b_proj.weight"].reshape(4, nope + v_dim, 32)


# ------------------------------------------------------------------------------------- the files


def test_v3_file(models):
    _, sd, path = models["deepseek-v3"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "deepseek2."
    assert kv["general.architecture"] == "deepseek2"
    assert kv[a + "attention.head_count_kv"] == 1
    assert kv[a + "attention.key_length"] == 40 and kv[a + "attention.value_length"] == 32
    assert kv[a + "attention.key_length_mla"] == 24 and kv[a + "attention.value_length_mla"] == 24
    assert kv[a + "attention.kv_lora_rank"] == 32 and kv[a + "attention.q_lora_rank"] == 48
    assert kv[a + "rope.dimension_count"] == 8 and kv[a + "leading_dense_block_count"] == 1
    assert kv[a + "expert_count"] == 8 and kv[a + "expert_used_count"] == 2 and kv[a + "expert_shared_count"] == 1
    assert kv[a + "expert_gating_func"] == 2 and kv[a + "expert_weights_norm"] is True
    assert kv[a + "expert_group_count"] == 4 and kv[a + "expert_group_used_count"] == 2
    assert kv[a + "expert_weights_scale"] == pytest.approx(2.5)
    assert kv[a + "rope.scaling.type"] == "yarn" and kv[a + "rope.scaling.factor"] == pytest.approx(4.0)
    assert kv[a + "rope.scaling.yarn_log_multiplier"] == pytest.approx(0.0707)
    kv_b = _kv_b(sd, 1, 16, 24)
    np.testing.assert_array_equal(t["blk.1.attn_k_b.weight"], kv_b[:, :16].swapaxes(1, 2))
    np.testing.assert_array_equal(t["blk.1.attn_v_b.weight"], kv_b[:, 16:])
    np.testing.assert_array_equal(t["blk.2.exp_probs_b.bias"], sd["model.layers.2.mlp.gate.e_score_correction_bias"])
    assert t["blk.1.ffn_gate_exps.weight"].shape == (8, 32, 64) and t["blk.1.ffn_gate_shexp.weight"].shape == (32, 64)
    # Layer 0 is dense: no router, no experts.
    assert "blk.0.ffn_gate.weight" in t and "blk.0.ffn_gate_inp.weight" not in t
    assert "blk.0.attn_kv_b.weight" not in t and "blk.0.attn_q.weight" not in t


def test_v2_file(models):
    _, sd, path = models["deepseek-v2"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "deepseek2."
    # Plain queries: q_lora_rank 0, which llama.cpp's loader reads for files of any depth.
    assert kv[a + "attention.q_lora_rank"] == 0 and "blk.0.attn_q.weight" in t and "blk.0.attn_q_a.weight" not in t
    assert kv[a + "expert_gating_func"] == 1 and kv[a + "expert_shared_count"] == 2
    assert a + "expert_weights_norm" not in kv and a + "expert_group_count" not in kv
    assert a + "rope.scaling.type" not in kv
    assert "blk.1.exp_probs_b.bias" not in t and t["blk.1.ffn_up_shexp.weight"].shape == (64, 64)
    np.testing.assert_array_equal(t["blk.1.attn_v_b.weight"], _kv_b(sd, 1, 16, 16)[:, 16:])


def test_glm_file(models):
    """GLM-4.7-Flash converts as llama.cpp's converter writes it: a deepseek2 file with sigmoid routing, its
    selection bias, renormalized weights and no groups."""
    _, sd, path = models["glm-4.7-flash"]
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    a = "deepseek2."
    assert kv["general.architecture"] == "deepseek2" and kv[a + "leading_dense_block_count"] == 1
    assert kv[a + "expert_gating_func"] == 2 and kv[a + "expert_weights_norm"] is True
    assert kv[a + "expert_weights_scale"] == pytest.approx(1.8) and kv[a + "expert_shared_count"] == 1
    assert a + "expert_group_count" not in kv and a + "rope.scaling.type" not in kv
    assert kv[a + "attention.q_lora_rank"] == 48 and kv[a + "vocab_size"] == t["token_embd.weight"].shape[0]
    np.testing.assert_array_equal(t["blk.2.exp_probs_b.bias"], sd["model.layers.2.mlp.gate.e_score_correction_bias"])
    np.testing.assert_array_equal(t["blk.2.attn_v_b.weight"], _kv_b(sd, 2, 16, 24)[:, 16:])
    assert "blk.0.ffn_gate.weight" in t and "blk.0.ffn_gate_inp.weight" not in t


# ----------------------------------------------------------------------------------- the logits


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("chunk", [64, 1], ids=["batch", "token-by-token"])
def test_logits_match_transformers(models, hf_reference, name, chunk):
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(models[name][2], PROMPT, chunk=chunk)
    assert hf_tiny.rel_diff(got, want) <= 1e-4


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", MODELS)
def test_inside_an_engine_batch(models, hf_reference, name, device):
    hf_tiny.check_inside_an_engine_batch(models[name][2], hf_reference, name, device)


@pytest.mark.parametrize("chunk", [40, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_match_cpu(models, name, chunk):
    """Every block on the GPU (absorbed queries, the latent row read as keys and values, V3's groups)
    against the CPU, both with the f16 KV cache."""
    hf_tiny.check_cuda_logits_match_cpu(models[name][2], PROMPT, chunk)


def test_prefix_cache_serves_the_latent(models, hf_reference):
    """The second run of the prompt attends over cached latent rows: same tokens and logprobs, and the
    first token is transformers' choice with its logprob."""
    path = models["deepseek-v3"][2]
    engine = _ember.Engine(_ember.Model(path, n_gpu_layers=0), n_ctx=128, max_num_seqs=4, n_threads=2,
                           type_k="f32", type_v="f32")
    runs = []
    for _ in range(2):
        rid = engine.add_request(PROMPT, temperature=0.0, max_tokens=4, logprobs=0)
        got = dict(tokens=[], logprobs=[], cached=None)
        done = False
        while not done:
            for o in engine.poll(1.0):
                assert o.request_id == rid
                got["tokens"] += o.token_ids
                got["logprobs"] += o.logprobs
                if o.finished:
                    assert o.finish_reason == "length", o.error
                    got["cached"], done = o.num_cached_tokens, True
        runs.append(got)
    engine.close()
    assert runs[0]["cached"] == 0 and runs[1]["cached"] > 0
    assert runs[1]["tokens"] == runs[0]["tokens"]
    np.testing.assert_allclose(runs[1]["logprobs"], runs[0]["logprobs"], rtol=0, atol=1e-5)
    want = hf_reference.logits("deepseek-v3", PROMPT)[-1]
    assert runs[0]["tokens"][0] == int(np.argmax(want))
    assert runs[0]["logprobs"][0] == pytest.approx(hf_tiny.log_softmax(want)[runs[0]["tokens"][0]], abs=1e-4)


@pytest.mark.parametrize("drop", [dict(fields={"deepseek2.expert_group_count": None,
                                                "deepseek2.expert_group_used_count": None}),
                                  dict(drop=[f"blk.{i}.exp_probs_b.bias" for i in (1, 2)])],
                         ids=["without-groups", "without-selection-bias"])
def test_v3_routing_parts_matter(models, hf_reference, tmp_path, drop):
    """Without its groups or its selection bias the tiny V3 no longer matches transformers: the test
    above does see them."""
    path = str(tmp_path / "edited.gguf")
    hf_tiny.rewritten_gguf(models["deepseek-v3"][2], path, **drop)
    want = hf_reference.logits("deepseek-v3", PROMPT)
    assert hf_tiny.rel_diff(hf_tiny.ember_logits(path, PROMPT), want) > 1e-2


def test_mtp_block_is_left_unused(models, hf_reference, tmp_path):
    """A file's multi-token-prediction block (nextn_predict_layers, after the trunk's blocks) is not run."""
    src = models["deepseek-v2"][2]
    extra = [(n.replace("blk.1.", "blk.2.", 1), np.ascontiguousarray(a))
             for n, a in hf_tiny.gguf_tensors(src).items() if n.startswith("blk.1.")]
    path = str(tmp_path / "mtp.gguf")
    hf_tiny.rewritten_gguf(src, path, fields={"deepseek2.block_count": 3, "deepseek2.nextn_predict_layers": 1},
                           extra=extra)
    want = hf_reference.logits("deepseek-v2", PROMPT)
    assert hf_tiny.rel_diff(hf_tiny.ember_logits(path, PROMPT), want) <= 1e-4


def _glm_with_mtp(models, tmp_path, n_next=1):
    """The tiny GLM with a multi-token-prediction block stored as layer 3 (as GLM-4.7-Flash's checkpoint holds
    layer 47): layer 2's decoder tensors again and random eh_proj / enorm / hnorm / shared_head.norm."""
    _, sd, _ = models["glm-4.7-flash"]
    rng = np.random.default_rng(83)
    mtp = {k.replace("model.layers.2.", "model.layers.3.", 1): v for k, v in sd.items()
           if k.startswith("model.layers.2.")}
    for name, shape in (("eh_proj", (64, 128)), ("enorm", (64,)), ("hnorm", (64,)), ("shared_head.norm", (64,))):
        mtp[f"model.layers.3.{name}.weight"] = rng.standard_normal(shape).astype(np.float32)
    d = hf_tiny.edited(models["glm-4.7-flash"][0], str(tmp_path / "hf"), {"num_nextn_predict_layers": n_next})
    hf_tiny._write_safetensors(os.path.join(d, "mtp.safetensors"), mtp, "float32")
    return d, mtp


def test_glm_mtp_block_follows_the_trunk(models, hf_reference, tmp_path):
    """GLM-4.7-Flash's MTP block converts as llama.cpp's converter writes it: block 3 after the trunk of 3
    (nextn_predict_layers 1) with its decoder tensors and nextn.*; the trunk's logits are unchanged."""
    d, mtp = _glm_with_mtp(models, tmp_path)
    path = str(tmp_path / "mtp.gguf")
    convert(d, path, "f32", progress=False)
    kv, t = hf_tiny.gguf_fields(path), hf_tiny.gguf_tensors(path)
    assert kv["deepseek2.block_count"] == 4 and kv["deepseek2.nextn_predict_layers"] == 1
    np.testing.assert_array_equal(t["blk.3.nextn.eh_proj.weight"], mtp["model.layers.3.eh_proj.weight"])
    np.testing.assert_array_equal(t["blk.3.nextn.shared_head_norm.weight"],
                                  mtp["model.layers.3.shared_head.norm.weight"])
    assert "blk.3.attn_k_b.weight" in t and t["blk.3.ffn_gate_exps.weight"].shape == (8, 32, 64)
    assert "blk.3.nextn.embed_tokens.weight" not in t and "blk.3.nextn.shared_head_head.weight" not in t
    want = hf_reference.logits("glm-4.7-flash", PROMPT)
    assert hf_tiny.rel_diff(hf_tiny.ember_logits(path, PROMPT), want) <= 1e-4


def test_glm_mtp_block_the_config_does_not_count_is_refused(models, tmp_path):
    d, _ = _glm_with_mtp(models, tmp_path, n_next=0)
    with pytest.raises(ConvertError, match="num_nextn_predict_layers=0 MTP blocks"):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)


# ------------------------------------------------------------------------- files without expert_gating_func


def test_v2_file_without_gating_routes_by_softmax(models, hf_reference, tmp_path):
    """DeepSeek V2 / V2.5 files written before the key route by softmax, as llama.cpp reads them."""
    path = str(tmp_path / "old.gguf")
    hf_tiny.rewritten_gguf(models["deepseek-v2"][2], path, fields={"deepseek2.expert_gating_func": None})
    want = hf_reference.logits("deepseek-v2", PROMPT)
    assert hf_tiny.rel_diff(hf_tiny.ember_logits(path, PROMPT), want) <= 1e-4


def test_glm_shape_without_gating_routes_by_sigmoid(models, tmp_path):
    """GLM-4.7-Flash's shape (47 trunk layers, 154880 tokens by vocab_size) routes by sigmoid without the key,
    as llama.cpp guesses: the tiny GLM made 47 layers deep by repeating its last block."""
    src = models["glm-4.7-flash"][2]
    blk2 = [(n, np.ascontiguousarray(a)) for n, a in hf_tiny.gguf_tensors(src).items() if n.startswith("blk.2.")]
    extra = [(n.replace("blk.2.", f"blk.{i}.", 1), a) for i in range(3, 47) for n, a in blk2]
    ids = PROMPT[:6]
    logits = {}
    for gating in (None, 1, 2):
        path = str(tmp_path / f"deep-{gating}.gguf")
        hf_tiny.rewritten_gguf(src, path, fields={"deepseek2.block_count": 47, "deepseek2.vocab_size": 154880,
                                                  "deepseek2.expert_gating_func": gating}, extra=extra)
        logits[gating] = hf_tiny.ember_logits(path, ids)
    np.testing.assert_array_equal(logits[None], logits[2])
    assert hf_tiny.rel_diff(logits[1], logits[2]) > 1e-3


def test_selection_bias_without_gating_is_refused(models, tmp_path):
    """Outside GLM-4.7-Flash's shape, a file with a selection bias and no expert_gating_func is sigmoid-routed
    by a model the shape does not name: refused rather than read as softmax."""
    path = str(tmp_path / "unsaid.gguf")
    hf_tiny.rewritten_gguf(models["glm-4.7-flash"][2], path, fields={"deepseek2.expert_gating_func": None})
    with pytest.raises(Exception, match="expert_gating_func is missing .* selection bias"):
        _ember.Model(path, n_gpu_layers=0)


# ------------------------------------------------------------------------------------------ placement


@pytest.mark.parametrize("fields", [dict(n_gpu_layers=1), dict(n_gpu_layers=-1),
                                    dict(n_gpu_layers=0, override_tensor=[r"blk\.2\.=CUDA"])],
                         ids=["one-layer", "all", "override"])
def test_gpu_placement(models, tmp_path, fields):
    """Blocks go to the GPU as asked; a file whose cached latent row (kv_lora_rank + rope, attention.key_length)
    is wider than the GPU's attention heads (512) is refused when it is placed, naming the width and
    n_gpu_layers=0. placement_plan plans as if CUDA were built in, so a CPU-only build exercises the check
    Model.load makes with its plan."""
    path = models["deepseek-v3"][2]
    plan = _ember.placement_plan(path, have_gpu=True, **fields)
    assert "CUDA" in plan["blocks"]
    wide = str(tmp_path / "wide.gguf")
    hf_tiny.rewritten_gguf(path, wide, fields={"deepseek2.attention.key_length": 576})
    with pytest.raises(Exception, match="deepseek2 cannot have blocks on the GPU: .*latent rows of 576 .*512"
                                        ".*n_gpu_layers=0"):
        _ember.placement_plan(wide, have_gpu=True, **fields)
    plan = _ember.placement_plan(wide, have_gpu=True, n_gpu_layers=0)
    assert set(plan["blocks"]) == {"CPU"}


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("case, message", [
    (dict(fields={"deepseek2.attention.kv_lora_rank": None}), "deepseek2.attention.kv_lora_rank is missing"),
    (dict(fields={"deepseek2.attention.value_length_mla": None}), "deepseek2.attention.value_length_mla is missing"),
    (dict(drop=["blk.1.attn_k_b.weight"]), "blk.1.attn_k_b.weight"),
    (dict(drop=["blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight"],
          extra=[("blk.0.attn_kv_b.weight", np.ones((4 * 40, 32), np.float32))]), "older conversion"),
    (dict(fields={"deepseek2.attention.head_count_kv": 4}), "head_count_kv must be 1"),
    (dict(fields={"deepseek2.expert_group_used_count": 5}), "expert_group_used_count 5"),
    (dict(fields={"deepseek2.expert_gating_func": 3}), "expert_gating_func 3"),
])
def test_bad_files_are_refused(models, tmp_path, case, message):
    path = str(tmp_path / "bad.gguf")
    hf_tiny.rewritten_gguf(models["deepseek-v3"][2], path, **case)
    with pytest.raises(Exception, match=message):
        _ember.Model(path, n_gpu_layers=0)


def test_values_are_read_from_the_key_cache(models):
    """The cache keeps one row a token, read as keys and values: a value type of its own is refused."""
    m = _ember.Model(models["deepseek-v2"][2], n_gpu_layers=0)
    with pytest.raises(Exception, match="type_v .* must be type_k"):
        _ember.Context(m, n_ctx=64, n_batch=64, n_threads=2, type_k="f16", type_v="bf16")


@pytest.mark.parametrize("name, edit, message", [
    ("deepseek-v3", {"kv_lora_rank": None}, "kv_lora_rank"),
    ("deepseek-v3", {"rope_interleave": False}, "rope_interleave=false"),
    ("deepseek-v3", {"n_group": 3}, "n_group=3"),
    ("deepseek-v3", lambda c: c["rope_parameters"].update(mscale=1.0), "mscale 1.0"),
    ("deepseek-v3", lambda c: c["rope_parameters"].pop("mscale_all_dim"), "'mscale'"),
    ("deepseek-v2", {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1}, "topk_method"),
    ("deepseek-v2", {"scoring_func": "sigmoid"}, "scoring_func"),
    ("glm-4.7-flash", {"mlp_layer_types": ["dense", "sparse", "dense"]}, "dense layers after a sparse one"),
    ("glm-4.7-flash", {"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ("glm-4.7-flash", lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5), "partial_rotary_factor"),
])
def test_bad_configs_are_refused(models, tmp_path, name, edit, message):
    d = hf_tiny.edited(models[name][0], str(tmp_path / "edited"), edit)
    with pytest.raises(ConvertError, match=message):
        convert(d, str(tmp_path / "out.gguf"), "f32", progress=False)
    assert not os.path.exists(tmp_path / "out.gguf")
