"""ember-convert's Gemma 4 (dense), as llama.cpp's converter writes it: sliding and global layers of
their own head size and KV heads (key_length / key_length_swa, a per-layer head_count_kv where they
differ), the global layers' proportional rope as rope_freqs.weight (1 for the rotated pairs, 1e30 for
the rest), KV shared by the last layers (they have no K/V tensors; with use_double_wide_mlp,
feed-forwards twice as wide: a per-layer feed_forward_length), per-layer embeddings and each layer's
layer_scalar. Norm weights are stored as they are (Gemma 4's RMSNorm has no 1 + w). The mixture
(enable_moe_block, 26B-A4B): every layer's router (ffn_gate_inp.weight and .scale), its experts' fused
gate_up_proj as ffn_gate_up_exps, down_proj as ffn_down_exps, per_expert_scale as ffn_down_exps.scale,
and the extra norms pre_ffw_norm_2, post_ffw_norm_1 and post_ffw_norm_2."""
import numpy as np

from .convert_error import ConvertError
from .convert_moe import Experts
from .convert_rope import split_rope_params


def _layer_types(config, n_layer, path):
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != n_layer:
        raise ConvertError(f"{path}: 'layer_types' must list num_hidden_layers={n_layer} layer types")
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layer_types'")
    return [t == "sliding_attention" for t in types]


def _global_value(config, key, per_layer_key, sliding, path):
    """A global layer's value: config[key], else the per_layer_config entry of a full-attention layer."""
    if config.get(key) is not None:
        return config[key]
    per_layer = config.get("per_layer_config") or {}
    for index, entry in per_layer.items():
        i = int(index)
        if i < len(sliding) and not sliding[i] and per_layer_key in (entry or {}):
            return entry[per_layer_key]
    return None


def _positive_int(value, what, path):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConvertError(f"{path}: {what} must be a positive integer, got {value!r}")
    return value


def _read_experts(config, path):
    n_expert = _positive_int(config.get("num_experts"), "'num_experts'", path)
    n_used = _positive_int(config.get("top_k_experts"), "'top_k_experts'", path)
    if n_used > n_expert:
        raise ConvertError(f"{path}: top_k_experts={n_used} exceeds num_experts={n_expert}")
    return Experts(n_expert, n_used, _positive_int(config.get("moe_intermediate_size"), "'moe_intermediate_size'",
                                                   path))


def read_gemma4(config, hp, path):
    if config.get("enable_moe_block"):
        hp.experts = _read_experts(config, path)
    if config.get("use_bidirectional_attention") == "all":
        raise ConvertError(f"{path}: use_bidirectional_attention='all' is not supported for gemma4")
    sliding = _layer_types(config, hp.n_layer, path)
    hp.swa_pattern = list(sliding)
    hp.n_swa = _positive_int(config.get("sliding_window"), "'sliding_window'", path)
    if config.get("final_logit_softcapping") is not None:
        hp.final_softcap = float(config["final_logit_softcapping"])

    d_swa = hp.head_dim
    d_full = _positive_int(_global_value(config, "global_head_dim", "head_dim", sliding, path) or d_swa,
                           "the global layers' head_dim", path)
    kv_swa = hp.n_head_kv
    kv_full = kv_swa
    if config.get("attention_k_eq_v", True):
        kv_full = _global_value(config, "num_global_key_value_heads", "num_key_value_heads", sliding, path) or kv_swa
    kv_full = _positive_int(kv_full, "the global layers' num_key_value_heads", path)
    if hp.n_head % kv_full:
        raise ConvertError(f"{path}: num_attention_heads={hp.n_head} is not a multiple of the global layers' "
                           f"{kv_full} KV heads")
    if d_full % 2:
        raise ConvertError(f"{path}: the global layers' head_dim={d_full} must be even for rope")
    hp.head_dim = d_full
    hp.family["head_dims"] = [d_swa if s else d_full for s in sliding]
    hp.family["kv_heads"] = [kv_swa if s else kv_full for s in sliding]
    if kv_full != kv_swa:
        hp.n_head_kv = hp.family["kv_heads"]

    full, local = split_rope_params(config)
    if (local or {}).get("rope_type", "default") != "default":
        raise ConvertError(f"{path}: unsupported rope scaling '{local['rope_type']}' of the sliding-window layers")
    if local is None:
        raise ConvertError(f"{path}: no rope parameters for the sliding-window layers")
    hp.rope_base_swa = float(local.get("rope_theta", 10_000.0))
    n_rot_swa = int(d_swa * float(local.get("partial_rotary_factor", 1.0)))
    if full.get("factor", 1.0) != 1.0:
        raise ConvertError(f"{path}: proportional rope with factor {full['factor']!r} is not supported")
    # Proportional rope rotates the first pairs at base^(-2i/head_dim) and leaves the rest: as
    # llama.cpp, a rope over the whole head whose other pairs' frequencies are divided by 1e30.
    n_rotated = int(d_full * float(full.get("partial_rotary_factor", 1.0)) / 2)
    hp.extra_tensors["rope_freqs.weight"] = np.array([1.0] * n_rotated + [1e30] * (d_full // 2 - n_rotated),
                                                     dtype=np.float32)

    n_shared = config.get("num_kv_shared_layers") or 0
    if isinstance(n_shared, bool) or not isinstance(n_shared, int) or not 0 <= n_shared < hp.n_layer:
        raise ConvertError(f"{path}: 'num_kv_shared_layers' must be in [0, {hp.n_layer}), got {n_shared!r}")
    first = hp.n_layer - n_shared
    for kind in set(sliding[first:]):
        if kind not in sliding[:first]:
            raise ConvertError(f"{path}: the KV-shared layers need an earlier layer of each of their kinds")
    n_per_layer = config.get("hidden_size_per_layer_input") or 0
    if n_per_layer:
        _positive_int(n_per_layer, "'hidden_size_per_layer_input'", path)
        if config.get("vocab_size_per_layer_input", hp.n_vocab) != hp.n_vocab:
            raise ConvertError(f"{path}: vocab_size_per_layer_input={config['vocab_size_per_layer_input']} must "
                               f"equal vocab_size={hp.n_vocab}")
    hp.int_keys.update({
        "attention.key_length_swa": d_swa, "attention.value_length_swa": d_swa,
        "rope.dimension_count_swa": n_rot_swa, "attention.shared_kv_layers": n_shared,
        "embedding_length_per_layer_input": n_per_layer,
    })
    # use_double_wide_mlp: the KV-sharing layers' feed-forwards are twice as wide (feed_forward_length
    # one a layer).
    wide = bool(config.get("use_double_wide_mlp")) and n_shared > 0
    n_ff = [hp.n_ff * (2 if wide and i >= first else 1) for i in range(hp.n_layer)]
    if wide:
        hp.n_ff = n_ff
    hp.family.update(shared_from=first, k_eq_v=bool(config.get("attention_k_eq_v", False)), n_per_layer=n_per_layer,
                     n_ff=n_ff)


def gemma4_tensors(hp):
    """Every layer's tensors (HF name -> GGUF name, shape, 0) and the per-layer embeddings'."""
    E, P, L, f = hp.n_embd, hp.family["n_per_layer"], hp.n_layer, hp.family
    out = {}
    if P:
        out["model.embed_tokens_per_layer.weight"] = ("per_layer_token_embd.weight", (hp.n_vocab, L * P), 0)
        out["model.per_layer_model_projection.weight"] = ("per_layer_model_proj.weight", (L * P, E), 0)
        out["model.per_layer_projection_norm.weight"] = ("per_layer_proj_norm.weight", (P,), 0)
    for i in range(L):
        d, kv = f["head_dims"][i], f["kv_heads"][i] * f["head_dims"][i]
        q = hp.n_head * d
        layer = {
            "input_layernorm.weight": ("attn_norm.weight", (E,)),
            "self_attn.q_proj.weight": ("attn_q.weight", (q, E)),
            "self_attn.q_norm.weight": ("attn_q_norm.weight", (d,)),
            "self_attn.o_proj.weight": ("attn_output.weight", (E, q)),
            "post_attention_layernorm.weight": ("post_attention_norm.weight", (E,)),
            "pre_feedforward_layernorm.weight": ("ffn_norm.weight", (E,)),
            "mlp.gate_proj.weight": ("ffn_gate.weight", (f["n_ff"][i], E)),
            "mlp.up_proj.weight": ("ffn_up.weight", (f["n_ff"][i], E)),
            "mlp.down_proj.weight": ("ffn_down.weight", (E, f["n_ff"][i])),
            "post_feedforward_layernorm.weight": ("post_ffw_norm.weight", (E,)),
            "layer_scalar": ("layer_output_scale.weight", (1,)),
        }
        if i < f["shared_from"]:
            layer["self_attn.k_proj.weight"] = ("attn_k.weight", (kv, E))
            layer["self_attn.k_norm.weight"] = ("attn_k_norm.weight", (d,))
            # attention_k_eq_v: the global layers' values are their keys' projection.
            if not (f["k_eq_v"] and not hp.swa_pattern[i]):
                layer["self_attn.v_proj.weight"] = ("attn_v.weight", (kv, E))
        if hp.experts:
            X, FX = hp.experts.n_expert, hp.experts.n_ff
            layer.update({
                "router.proj.weight": ("ffn_gate_inp.weight", (X, E)),
                "router.scale": ("ffn_gate_inp.scale", (E,)),
                "router.per_expert_scale": ("ffn_down_exps.scale", (X,)),
                "experts.gate_up_proj": ("ffn_gate_up_exps.weight", (X, 2 * FX, E)),
                "experts.down_proj": ("ffn_down_exps.weight", (X, E, FX)),
                "pre_feedforward_layernorm_2.weight": ("pre_ffw_norm_2.weight", (E,)),
                "post_feedforward_layernorm_1.weight": ("post_ffw_norm_1.weight", (E,)),
                "post_feedforward_layernorm_2.weight": ("post_ffw_norm_2.weight", (E,)),
            })
        if P:
            layer["per_layer_input_gate.weight"] = ("inp_gate.weight", (P, E))
            layer["per_layer_projection.weight"] = ("proj.weight", (E, P))
            layer["post_per_layer_input_norm.weight"] = ("post_norm.weight", (E,))
        for suffix, (name, shape) in layer.items():
            out[f"model.layers.{i}.{suffix}"] = (f"blk.{i}.{name}", shape, 0)
    return out
