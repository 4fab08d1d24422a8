"""ember-convert's families whose checkpoints fuse tensors or rotate part of each head, as llama.cpp's
converter writes them: Phi-3 / Phi-4 (fused qkv_proj and gate_up_proj, partial rotary, LongRoPE's
short and long factors with their attention factor, the sliding window), Mistral 3 (YaRN with
mscale_all_dim, llama 4's attention temperature), GLM-4 (fused gate_up_proj, norms after attention
and the feed-forward, partial rotary) and Command R / cohere2 (one LayerNorm before parallel attention
and feed-forward, logit scale, cohere2's sliding windows). Each gives a reader of its
config keys and an edit of the per-layer tensor map (convert_arch.ArchSpec's read_extra and layer_map)."""
import math

import numpy as np

from .convert_error import ConvertError


def _rotated_dims(config, rope_params, hp, path):
    """llama.cpp's rope.dimension_count: int(partial_rotary_factor * n_embd) // n_head."""
    factor = rope_params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConvertError(f"{path}: 'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    n_rot = int(factor * hp.n_embd) // hp.n_head
    if n_rot % 2 or n_rot <= 0 or n_rot > hp.head_dim:
        raise ConvertError(f"{path}: partial_rotary_factor {factor} rotates {n_rot} dimensions of a head of "
                           f"{hp.head_dim}; it must be even and at most the head")
    return n_rot


def _factors(rope_params, key, n, path):
    values = rope_params.get(key)
    if not isinstance(values, list) or len(values) != n:
        raise ConvertError(f"{path}: LongRoPE's '{key}' must be a list of {n} numbers (rotated dimensions / 2)")
    out = np.asarray(values, dtype=np.float32)
    if not np.all(out > 0):
        raise ConvertError(f"{path}: LongRoPE's '{key}' must be positive")
    return out


def read_phi3(config, hp, path):
    """Partial rotary, LongRoPE (rope_type 'longrope': both factor lists and the attention factor
    sqrt(1 + ln(s) / ln(orig)) for s = max_position_embeddings / original, unless the config gives
    one), and the sliding window (0 when none, as llama.cpp writes Phi-4's)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    hp.n_rot = _rotated_dims(config, params, hp, path)
    window = config.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise ConvertError(f"{path}: 'sliding_window' must be a non-negative integer, got {window!r}")
    hp.n_swa = int(window or 0)
    hp.write_swa = True
    orig = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    if orig is not None:
        hp.orig_ctx = int(orig)
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return
    if kind not in ("longrope", "su"):
        raise ConvertError(f"{path}: unsupported rope scaling '{kind}' for phi3 (ember-convert writes: longrope)")
    if orig is None:
        raise ConvertError(f"{path}: LongRoPE needs 'original_max_position_embeddings'")
    n = hp.n_rot // 2
    hp.extra_tensors["rope_factors_long.weight"] = _factors(params, "long_factor", n, path)
    hp.extra_tensors["rope_factors_short.weight"] = _factors(params, "short_factor", n, path)
    attn = params.get("attention_factor")
    if attn is None:
        scale = hp.n_ctx / hp.orig_ctx
        attn = math.sqrt(1 + math.log(scale) / math.log(hp.orig_ctx)) if scale > 1.0 else 1.0
    hp.rope_attn_factor = float(attn)


def phi3_layers(out, hp):
    """Q, K, V as one attn_qkv and gate, up as one ffn_up (gate rows first), as the checkpoint has them."""
    q, kv, E = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_embd
    for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight"):
        del out[name]
    out["self_attn.qkv_proj.weight"] = ("attn_qkv.weight", (q + 2 * kv, E), 0)
    out["mlp.gate_up_proj.weight"] = ("ffn_up.weight", (2 * hp.n_ff, E), 0)


def read_mistral3(config, hp, path):
    """llama 4's attention temperature (rope_parameters' llama_4_scaling_beta, over the original
    context) as attention.temperature_scale; no sliding window."""
    params = dict(config.get("rope_parameters") or {})
    if config.get("sliding_window") is not None or config.get("layer_types"):
        raise ConvertError(f"{path}: sliding-window attention is not supported for mistral3")
    beta = params.get("llama_4_scaling_beta")
    if beta is not None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0:
            raise ConvertError(f"{path}: 'llama_4_scaling_beta' must be a non-negative number, got {beta!r}")
        if hp.rope.scaling != "yarn":
            raise ConvertError(f"{path}: 'llama_4_scaling_beta' needs YaRN's original_max_position_embeddings")
        hp.keys["attention.temperature_scale"] = float(beta)


def read_glm4(config, hp, path):
    """Rotated dimensions as llama.cpp's converter counts them for GLM-4: head_dim * partial_rotary_factor
    (0.5 when the config says nothing)."""
    params = dict(config.get("rope_parameters") or {})
    if config.get("attention_bias") is False:
        raise ConvertError(f"{path}: attention_bias=false is not supported for glm4 (its releases have Q/K/V biases)")
    if "mrope_section" in params:
        raise ConvertError(f"{path}: GLM-4's multimodal rope (mrope_section) is not supported")
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.5))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConvertError(f"{path}: 'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    hp.n_rot = int(hp.head_dim * factor)
    if hp.n_rot % 2 or hp.n_rot <= 0:
        raise ConvertError(f"{path}: partial_rotary_factor {factor} rotates {hp.n_rot} dimensions of a head of "
                           f"{hp.head_dim}; it must be even and positive")


def glm4_layers(out, hp):
    """The fused gate_up_proj, and GLM-4's four norms: post_self_attn_layernorm after attention, the
    feed-forward's input norm (post_attention_layernorm) and post_mlp_layernorm after it."""
    for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        del out[name]
    out["mlp.gate_up_proj.weight"] = ("ffn_up.weight", (2 * hp.n_ff, hp.n_embd), 0)
    out["post_self_attn_layernorm.weight"] = ("post_attention_norm.weight", (hp.n_embd,), 0)
    out["post_mlp_layernorm.weight"] = ("post_ffw_norm.weight", (hp.n_embd,), 0)


def _positive(config, key, path):
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConvertError(f"{path}: '{key}' must be a positive number, got {value!r}")
    return float(value)


def read_cohere(config, hp, path, qk_norm=True):
    """Command R: the LayerNorm epsilon and logit_scale keys, and Command R+'s per-head q/k LayerNorms
    where use_qk_norm says (not cohere2's: llama.cpp's cohere2 has none)."""
    hp.family["qk_norm"] = bool(config.get("use_qk_norm"))
    if hp.family["qk_norm"] and not qk_norm:
        raise ConvertError(f"{path}: use_qk_norm=true (per-head q/k LayerNorms) is not supported for cohere2")
    hp.keys["attention.layer_norm_epsilon"] = _positive(config, "layer_norm_eps", path)
    hp.keys["logit_scale"] = _positive(config, "logit_scale", path)


def read_cohere2(config, hp, path):
    """cohere2: Command R's keys, and its sliding window over the layers transformers' layer_types
    marks (llama.cpp's default: three of each four); the period written only when it is not 4."""
    read_cohere(config, hp, path, qk_norm=False)
    types = config.get("layer_types")
    if types is None:
        period = config.get("sliding_window_pattern", 4)
        types = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(hp.n_layer)]
    if len(types) != hp.n_layer or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise ConvertError(f"{path}: 'layer_types' must name sliding_attention or full_attention for each of the "
                           f"{hp.n_layer} layers")
    sliding = [t == "sliding_attention" for t in types]
    window = config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ConvertError(f"{path}: 'sliding_window' must be a positive integer, got {window!r}")
    hp.n_swa = window
    fits = lambda p: sliding == [i % p < p - 1 for i in range(hp.n_layer)]  # noqa: E731
    hp.swa_pattern = None if fits(4) else next((p for p in range(1, hp.n_layer + 2) if fits(p)), list(sliding))


def cohere_layers(out, hp):
    """One norm a block (input_layernorm, before attention and the feed-forward alike); Command R+'s
    q/k LayerNorms carry a weight per head ([n_head, head_dim], GGUF's {head_dim, n_head})."""
    del out["post_attention_layernorm.weight"]
    if hp.family.get("qk_norm"):
        out["self_attn.q_norm.weight"] = ("attn_q_norm.weight", (hp.n_head, hp.head_dim), 0)
        out["self_attn.k_norm.weight"] = ("attn_k_norm.weight", (hp.n_head_kv, hp.head_dim), 0)
