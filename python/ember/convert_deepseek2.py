"""ember-convert's DeepSeek V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM) and GLM-4.7-Flash
(Glm4MoeLiteForCausalLM: V3's attention and routing, its dense layers named by mlp_layer_types, its MTP
blocks after the trunk), as llama.cpp's converter writes deepseek2 files: latent attention as one KV head
with key_length kv_lora_rank + rope and value_length kv_lora_rank (the _mla keys give a head's own sizes),
kv_b_proj split into attn_k_b (transposed, for the queries) and attn_v_b, the first first_k_dense_replace
layers dense, the others a mixture with shared experts and V3's e_score_correction_bias as exp_probs_b, and
YaRN's mscale_all_dim times 0.1 as rope.scaling.yarn_log_multiplier. What a deepseek2 file cannot say is
refused."""
import os
import re

import numpy as np

from .convert_error import ConvertError
from .convert_moe import Experts, ExpertLayout, ExpertTensor, expert_tensors
from .convert_safetensors import Checkpoint

_EXPERTS = ExpertLayout("mlp.gate", ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj",
                                     "mlp.experts.{e}.down_proj"))
# llama.cpp's expert_gating_func values.
_SOFTMAX, _SIGMOID = 1, 2
# Classes that route as DeepSeek V3 (sigmoid, selection bias, groups).
_V3_CLASSES = ("DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM")
# A GLM-4.7-Flash MTP block's own tensors beside its decoder layer: HF name -> (GGUF name, required), as
# llama.cpp maps and loads them.
_NEXTN = {"eh_proj.weight": ("nextn.eh_proj.weight", True), "enorm.weight": ("nextn.enorm.weight", True),
          "hnorm.weight": ("nextn.hnorm.weight", True),
          "shared_head.norm.weight": ("nextn.shared_head_norm.weight", False),
          "embed_tokens.weight": ("nextn.embed_tokens.weight", False),
          "shared_head.head.weight": ("nextn.shared_head_head.weight", False)}


def _int(config, key, path, default=None, minimum=1):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConvertError(f"{path}: '{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def _routing(config, hp, path, v3):
    """The mixture's keys: V2 routes by softmax (greedy, unnormalized), V3 by sigmoid with a selection bias,
    groups and renormalization."""
    n_expert = _int(config, "n_routed_experts", path)
    n_used = _int(config, "num_experts_per_tok", path)
    if n_used > n_expert:
        raise ConvertError(f"{path}: num_experts_per_tok={n_used} exceeds n_routed_experts={n_expert}")
    n_ff = _int(config, "moe_intermediate_size", path)
    dense = _dense_layers(config, hp, path)
    if dense > hp.n_layer:
        raise ConvertError(f"{path}: first_k_dense_replace={dense} exceeds num_hidden_layers={hp.n_layer}")
    if config.get("moe_layer_freq", 1) != 1:
        raise ConvertError(f"{path}: moe_layer_freq={config['moe_layer_freq']} is not supported (a deepseek2 file "
                           "has mixtures in every layer after the dense ones)")
    scoring = config.get("scoring_func", "sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ConvertError(f"{path}: scoring_func={scoring!r} is not what transformers' "
                           f"{'DeepseekV3' if v3 else 'DeepseekV2'} routes by")
    groups = config.get("n_group") or 1
    used_groups = config.get("topk_group") or groups
    if v3:
        groups, used_groups = _int(config, "n_group", path, 1), _int(config, "topk_group", path, 1)
        if n_expert % groups or used_groups > groups or n_used > used_groups * (n_expert // groups):
            raise ConvertError(f"{path}: n_group={groups} and topk_group={used_groups} must split n_routed_experts="
                               f"{n_expert} evenly and leave num_experts_per_tok={n_used} experts to choose from")
        if groups > 1 and n_expert // groups < 2:
            raise ConvertError(f"{path}: groups of one expert (n_group={groups}): a group scores its best two")
    else:
        method = config.get("topk_method", "greedy")
        if method != "greedy":
            # llama.cpp's deepseek2 scores a group by the sum of its two best experts, V2 by its best one.
            raise ConvertError(f"{path}: topk_method={method!r} is not supported for DeepSeek V2 (greedy only)")
        groups = used_groups = 1
    scale = config.get("routed_scaling_factor", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ConvertError(f"{path}: 'routed_scaling_factor' must be a positive number, got {scale!r}")
    shared = _int(config, "n_shared_experts", path, 0, minimum=0)
    hp.family.update(n_expert=n_expert, n_used=n_used, n_ff_exp=n_ff, dense=dense, shared=shared, v3=v3)
    hp.int_keys.update({"expert_count": n_expert, "expert_used_count": n_used, "expert_feed_forward_length": n_ff,
                        "leading_dense_block_count": dense, "expert_shared_count": shared,
                        "expert_gating_func": _SIGMOID if v3 else _SOFTMAX})
    if groups > 1:
        hp.int_keys.update({"expert_group_count": groups, "expert_group_used_count": used_groups})
    hp.keys["expert_weights_scale"] = float(scale)
    # transformers' V2 router never renormalizes; V3's does as norm_topk_prob says.
    if v3 and config.get("norm_topk_prob", True):
        hp.bool_keys["expert_weights_norm"] = True


def _dense_layers(config, hp, path):
    """The leading dense layers: GLM-4.7-Flash's transformers class reads mlp_layer_types (one dense layer when
    absent), DeepSeek's first_k_dense_replace. A deepseek2 file can only say "the first k"."""
    if "Glm4MoeLiteForCausalLM" not in (config.get("architectures") or []):
        return _int(config, "first_k_dense_replace", path, 0, minimum=0)
    types = config.get("mlp_layer_types")
    if types is None:
        return min(1, hp.n_layer)
    if not isinstance(types, list) or len(types) != hp.n_layer or any(t not in ("dense", "sparse") for t in types):
        raise ConvertError(f"{path}: 'mlp_layer_types' must list 'dense' or 'sparse' for each of the "
                           f"num_hidden_layers={hp.n_layer} layers, got {types!r}")
    dense = types.index("sparse") if "sparse" in types else len(types)
    if "dense" in types[dense:]:
        raise ConvertError(f"{path}: mlp_layer_types {types!r}: dense layers after a sparse one are not supported "
                           "(a deepseek2 file has dense layers only before the first mixture)")
    return dense


def _mtp_blocks(config, hp, path):
    """GLM-4.7-Flash's multi-token-prediction blocks, written after the trunk as llama.cpp's converter writes
    them (nextn_predict_layers): those the checkpoint holds, as layers past num_hidden_layers (a checkpoint
    saved by transformers has none). Returns {block: the optional nextn tensors it holds}."""
    n_next = _int(config, "num_nextn_predict_layers", path, 0, minimum=0)
    names = set(Checkpoint(os.path.dirname(path)).names())
    stored = sorted({int(m.group(1)) for m in map(re.compile(r"model\.layers\.(\d+)\.").match, names)
                     if m and int(m.group(1)) >= hp.n_layer})
    if stored and (stored != list(range(hp.n_layer, hp.n_layer + len(stored))) or len(stored) > n_next):
        raise ConvertError(f"{path}: the checkpoint's layers {stored} past num_hidden_layers={hp.n_layer} are not "
                           f"the num_nextn_predict_layers={n_next} MTP blocks that follow the trunk")
    return {i: [hf for hf, (_, required) in _NEXTN.items() if not required and f"model.layers.{i}.{hf}" in names]
            for i in stored}


def read_deepseek2(config, hp, path):
    v3 = bool(set(_V3_CLASSES) & set(config.get("architectures") or []))
    rope_params = config.get("rope_parameters") or {}
    partial = rope_params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        # transformers would rotate part of qk_rope_head_dim; a deepseek2 file rotates all of it.
        raise ConvertError(f"{path}: partial_rotary_factor={partial!r} is not supported for deepseek2 (1.0 only)")
    q_lora = config.get("q_lora_rank")
    q_lora = 0 if q_lora is None else _int(config, "q_lora_rank", path)
    kv_lora = _int(config, "kv_lora_rank", path)
    nope, rope = _int(config, "qk_nope_head_dim", path), _int(config, "qk_rope_head_dim", path)
    v_dim = _int(config, "v_head_dim", path)
    if rope % 2:
        raise ConvertError(f"{path}: qk_rope_head_dim={rope} must be even for rope")
    if v3 and not config.get("rope_interleave", True):
        # llama.cpp's deepseek2 rotates adjacent pairs, the layout rope_interleave=true reads the weights in.
        raise ConvertError(f"{path}: rope_interleave=false is not supported (a deepseek2 file rotates adjacent pairs)")
    if hp.rope.scaling == "yarn":
        if hp.rope.yarn_log_mul is None or hp.rope.yarn_attn_factor is not None:
            raise ConvertError(f"{path}: rope scaling 'yarn' needs mscale and mscale_all_dim (equal) and no "
                               "attention_factor for deepseek2")
        hp.rope.yarn_log_mul *= 0.1   # llama.cpp's deepseek2 files keep mscale_all_dim times 0.1
    hp.n_head_kv = 1   # the latent is one KV head
    hp.head_dim, hp.value_length, hp.n_rot = kv_lora + rope, kv_lora, rope
    hp.family.update(q_lora=q_lora, kv_lora=kv_lora, nope=nope, rope=rope, v_dim=v_dim)
    hp.int_keys.update({"attention.kv_lora_rank": kv_lora, "attention.key_length_mla": nope + rope,
                        "attention.value_length_mla": v_dim})
    # 0 for plain queries: llama.cpp's loader takes a file without the key for V2-Lite by its layer count only.
    hp.int_keys["attention.q_lora_rank"] = q_lora
    _routing(config, hp, path, v3)
    mtp = _mtp_blocks(config, hp, path) if "Glm4MoeLiteForCausalLM" in config.get("architectures", []) else {}
    hp.family.update(trunk=hp.n_layer, mtp=mtp)
    if mtp:
        hp.n_layer += len(mtp)
        hp.int_keys["nextn_predict_layers"] = len(mtp)


def deepseek2_tensors(hp):
    """Every layer's plain tensors: HF name -> (GGUF name, numpy shape, 0)."""
    f, E, H = hp.family, hp.n_embd, hp.n_head
    K, L, R, V = f["nope"] + f["rope"], f["kv_lora"], f["rope"], f["v_dim"]
    X, FX = f["n_expert"], f["n_ff_exp"]
    out = {}
    for i in range(hp.n_layer):
        t = {
            "input_layernorm.weight": ("attn_norm.weight", (E,)),
            "self_attn.kv_a_proj_with_mqa.weight": ("attn_kv_a_mqa.weight", (L + R, E)),
            "self_attn.kv_a_layernorm.weight": ("attn_kv_a_norm.weight", (L,)),
            "self_attn.o_proj.weight": ("attn_output.weight", (E, H * V)),
            "post_attention_layernorm.weight": ("ffn_norm.weight", (E,)),
        }
        if f["q_lora"]:
            t["self_attn.q_a_proj.weight"] = ("attn_q_a.weight", (f["q_lora"], E))
            t["self_attn.q_a_layernorm.weight"] = ("attn_q_a_norm.weight", (f["q_lora"],))
            t["self_attn.q_b_proj.weight"] = ("attn_q_b.weight", (H * K, f["q_lora"]))
        else:
            t["self_attn.q_proj.weight"] = ("attn_q.weight", (H * K, E))
        if i < f["dense"]:
            for kind, shape in (("gate", (hp.n_ff, E)), ("up", (hp.n_ff, E)), ("down", (E, hp.n_ff))):
                t[f"mlp.{kind}_proj.weight"] = (f"ffn_{kind}.weight", shape)
        else:
            if f["v3"]:
                t["mlp.gate.e_score_correction_bias"] = ("exp_probs_b.bias", (X,))
            S = FX * f["shared"]
            if S:
                for kind, shape in (("gate", (S, E)), ("up", (S, E)), ("down", (E, S))):
                    t[f"mlp.shared_experts.{kind}_proj.weight"] = (f"ffn_{kind}_shexp.weight", shape)
        if i >= f["trunk"]:
            for hf, (g, required) in _NEXTN.items():
                if required or hf in f["mtp"][i]:
                    t[hf] = (g, (E, 2 * E) if hf == "eh_proj.weight" else (E,) if "norm" in hf else (hp.n_vocab, E))
        out.update({f"model.layers.{i}.{k}": (f"blk.{i}.{g}", s, 0) for k, (g, s) in t.items()})
    return out


def _k_b(nope, v_dim, n_head):
    """kv_b_proj [H * (nope + v), L]: each head's key rows, transposed to [H, L, nope]."""
    return lambda a: np.ascontiguousarray(a[0].reshape(n_head, nope + v_dim, -1)[:, :nope].swapaxes(1, 2))


def _v_b(nope, v_dim, n_head):
    """Each head's value rows [H, v, L]."""
    return lambda a: np.ascontiguousarray(a[0].reshape(n_head, nope + v_dim, -1)[:, nope:])


def deepseek2_transformed(hp):
    """kv_b_proj split per layer, and the mixture layers' router and stacked experts."""
    f, H = hp.family, hp.n_head
    nope, L, V = f["nope"], f["kv_lora"], f["v_dim"]
    ex = Experts(f["n_expert"], f["n_used"], f["n_ff_exp"])
    out = []
    for i in range(hp.n_layer):
        kv_b = ((f"model.layers.{i}.self_attn.kv_b_proj.weight", (H * (nope + V), L)),)
        out.append(ExpertTensor(f"blk.{i}.attn_k_b.weight", (H, L, nope), kv_b, _k_b(nope, V, H)))
        out.append(ExpertTensor(f"blk.{i}.attn_v_b.weight", (H, V, L), kv_b, _v_b(nope, V, H)))
        if i >= f["dense"]:
            out += expert_tensors(_EXPERTS, hp, ex, i)
    return out
