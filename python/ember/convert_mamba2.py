"""Mamba2 hybrids -> GGUF, as llama.cpp's converter writes them: Nemotron-H (nemotron_h: each layer one
mixer, a Mamba2 layer, an attention layer without rope or a squared-ReLU MLP, the kinds written as
per-layer head_count_kv and feed_forward_length holding 0 for the part a layer lacks; nemotron_h_moe where
the MLPs are mixtures of squared-ReLU experts beside a shared one) and Granite 4.0
hybrid (granitehybrid: Mamba2 or attention layers each with a SwiGLU feed-forward, or SwiGLU experts beside
a shared expert, muP multipliers).
A Mamba2 layer's in_proj is stored whole, its convolution squeezed to [channels, kernel], ssm_a =
-exp(A_log) and ssm_d as [n_head, 1], its grouped norm as [n_group, inner / n_group]; q and k rows are
put in llama's rope layout as llama.cpp does (these attention layers have no rope, so it changes no
score)."""
import numpy as np

from .convert_error import ConvertError
from .convert_families import read_granite
from .convert_moe import ExpertTensor

# Nemotron-H's layer kinds: Mamba2, attention, MLP, as hybrid_override_pattern spells them.
_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                   "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
_GRANITE_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                  "full_attention": "attention"}


def _positive_int(config, keys, path, default=None):
    for key in keys:
        if config.get(key) is not None:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConvertError(f"{path}: '{key}' must be a positive integer, got {value!r}")
            return value
    if default is None:
        raise ConvertError(f"{path}: missing key '{keys[0]}'")
    return default


def _nemotron_kinds(config, path):
    types = config.get("layers_block_type")
    if types is None:
        pattern = config.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ConvertError(f"{path}: neither 'layers_block_type' nor 'hybrid_override_pattern' gives the layers")
        bad = sorted(set(pattern) - set(_PATTERN))
        if bad:
            raise ConvertError(f"{path}: unknown layer kind {bad[0]!r} in 'hybrid_override_pattern' (M, *, -, E)")
        return [_PATTERN[c] for c in pattern]
    if not isinstance(types, list) or not types:
        raise ConvertError(f"{path}: 'layers_block_type' must be a list of layer types, got {types!r}")
    for t in types:
        if t not in _NEMOTRON_KINDS:
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layers_block_type'")
    return [_NEMOTRON_KINDS[t] for t in types]


def nemotron_h_variant(config):
    """llama.cpp's name for a Nemotron-H with mixture layers (Nemotron 3)."""
    return "nemotron_h_moe" if "moe" in _nemotron_kinds(config, "config.json") else "nemotron_h"


def complete_nemotron_h(config, path):
    """transformers saves Nemotron-H's layer count only as the length of its layer list."""
    kinds = _nemotron_kinds(config, path)
    n = config.get("num_hidden_layers")
    if n is not None and n != len(kinds):
        raise ConvertError(f"{path}: num_hidden_layers={n} but the layer list has {len(kinds)} entries")
    return {**config, "num_hidden_layers": len(kinds)}


def _read_mamba2(config, hp, path, kinds, heads, head_dim, groups, state, kernel):
    """The Mamba2 shapes (under each family's own key names) as the ssm.* keys, and the layer kinds."""
    n_head = _positive_int(config, heads, path)
    p = _positive_int(config, head_dim, path)
    n_group = _positive_int(config, groups, path)
    d_state = _positive_int(config, state, path)
    d_conv = _positive_int(config, kernel, path)
    if n_head % n_group:
        raise ConvertError(f"{path}: '{heads[0]}'={n_head} is not a multiple of '{groups[0]}'={n_group}")
    hp.family = dict(kinds=kinds, n_expert=config.get("num_local_experts") or 0, n_head=n_head, head_dim=p,
                     n_group=n_group, d_state=d_state, kernel=d_conv,
                     conv_bias=bool(config.get("use_conv_bias", config.get("mamba_conv_bias", True))))
    hp.int_keys.update({"ssm.conv_kernel": d_conv, "ssm.state_size": d_state, "ssm.group_count": n_group,
                        "ssm.time_step_rank": n_head, "ssm.inner_size": n_head * p})
    hp.n_head_kv_layer = [hp.n_head_kv if k == "attention" else 0 for k in kinds]


def read_nemotron_h(config, hp, path):
    kinds = _nemotron_kinds(config, path)
    if "moe" in kinds:
        _read_nemotron_experts(config, hp, path)
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if config.get(key, want) != want:
            raise ConvertError(f"{path}: '{key}' must be {want!r} (llama.cpp's nemotron_h), got {config[key]!r}")
    for key in ("use_bias", "mamba_proj_bias"):
        if config.get(key):
            raise ConvertError(f"{path}: {key}=true is not supported for nemotron_h")
    eps = config.get("layer_norm_epsilon", 1e-5)
    hp.rms_eps = float(eps)
    # llama.cpp's nemotron_h reads this key (and the RMS one only where present).
    hp.keys["attention.layer_norm_epsilon"] = hp.rms_eps
    _read_mamba2(config, hp, path, kinds, ("mamba_num_heads",), ("mamba_head_dim",), ("n_groups",),
                 ("ssm_state_size",), ("conv_kernel",))
    hp.n_ff_layer = [hp.n_ff if k == "mlp" else hp.int_keys.get("expert_feed_forward_length", 0) if k == "moe" else 0
                     for k in kinds]


def _read_nemotron_experts(config, hp, path):
    """The mixture layers' keys as llama.cpp's converter writes them; what its nemotron_h_moe cannot run
    (latent experts, group-limited routing, other than one shared expert) is refused."""
    if config.get("moe_latent_size") is not None:
        raise ConvertError(f"{path}: moe_latent_size (experts in a latent space) is not supported")
    if config.get("n_group", 1) != 1 or config.get("topk_group", 1) != 1:
        raise ConvertError(f"{path}: group-limited routing (n_group, topk_group above 1) is not supported")
    if config.get("n_shared_experts", 1) != 1:
        raise ConvertError(f"{path}: n_shared_experts must be 1, got {config['n_shared_experts']!r}")
    n_expert = _positive_int(config, ("n_routed_experts",), path)
    n_used = _positive_int(config, ("num_experts_per_tok",), path)
    if n_used > n_expert:
        raise ConvertError(f"{path}: num_experts_per_tok={n_used} exceeds n_routed_experts={n_expert}")
    hp.int_keys.update({"expert_count": n_expert, "expert_used_count": n_used,
                        "expert_feed_forward_length": _positive_int(config, ("moe_intermediate_size",), path),
                        "expert_shared_feed_forward_length": _positive_int(
                            config, ("moe_shared_expert_intermediate_size",), path),
                        "expert_shared_count": 1, "expert_group_count": 1})
    hp.bool_keys["expert_weights_norm"] = bool(config.get("norm_topk_prob", True))
    hp.keys["expert_weights_scale"] = float(config.get("routed_scaling_factor", 1.0))


def read_granite_hybrid(config, hp, path):
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != hp.n_layer:
        raise ConvertError(f"{path}: 'layer_types' must list num_hidden_layers={hp.n_layer} layer types, "
                           f"got {types!r}")
    for t in types:
        if t not in _GRANITE_KINDS:
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layer_types' (mamba, attention)")
    if config.get("position_embedding_type") == "rope":
        raise ConvertError(f"{path}: position_embedding_type 'rope' is not supported for granitehybrid (llama.cpp's "
                           "converter writes its hybrids without rope)")
    if config.get("mamba_proj_bias"):
        raise ConvertError(f"{path}: mamba_proj_bias=true is not supported for granitehybrid")
    read_granite({k: v for k, v in config.items() if k != "layer_types"}, hp, path)
    # The dense feed-forward is transformers' shared_mlp, of shared_intermediate_size; in a mixture that is
    # the shared expert, and feed_forward_length the routed experts' width.
    shared = _positive_int(config, ("shared_intermediate_size",), path)
    hp.int_keys["expert_shared_feed_forward_length"] = shared
    n_expert = config.get("num_local_experts") or 0
    if n_expert:
        n_used = _positive_int(config, ("num_experts_per_tok",), path)
        if n_used > n_expert:
            raise ConvertError(f"{path}: num_experts_per_tok={n_used} exceeds num_local_experts={n_expert}")
        hp.int_keys.update({"expert_count": n_expert, "expert_used_count": n_used})
    else:
        hp.n_ff = shared
    hp.bool_keys["rope.scaling.finetuned"] = False
    kinds = [_GRANITE_KINDS[t] for t in types]
    _read_mamba2(config, hp, path, kinds, ("mamba_n_heads",), ("mamba_d_head",), ("mamba_n_groups",),
                 ("mamba_d_state",), ("mamba_d_conv",))
    inner = hp.family["n_head"] * hp.family["head_dim"]
    expand = config.get("mamba_expand", 2)
    if inner != expand * hp.n_embd:
        raise ConvertError(f"{path}: mamba_n_heads * mamba_d_head = {inner} must be mamba_expand * hidden_size = "
                           f"{expand * hp.n_embd} (transformers' Mamba2 width)")


def _mamba2_dims(hp):
    h = hp.family
    inner = h["n_head"] * h["head_dim"]
    return inner, inner + 2 * h["n_group"] * h["d_state"]


def _attention(hp, prefix, block, mixer):
    E, D = hp.n_embd, hp.head_dim
    q, kv = hp.n_head * D, hp.n_head_kv * D
    return {prefix + mixer + "q_proj.weight": (block + "attn_q.weight", (q, E), hp.n_head),
            prefix + mixer + "k_proj.weight": (block + "attn_k.weight", (kv, E), hp.n_head_kv),
            prefix + mixer + "v_proj.weight": (block + "attn_v.weight", (kv, E), 0),
            prefix + mixer + "o_proj.weight": (block + "attn_output.weight", (E, q), 0)}


def _mamba2_plain(hp, prefix, block, mixer):
    E, H = hp.n_embd, hp.family["n_head"]
    inner, conv = _mamba2_dims(hp)
    out = {prefix + mixer + "in_proj.weight": (block + "ssm_in.weight", (inner + conv + H, E), 0),
           prefix + mixer + "dt_bias": (block + "ssm_dt.bias", (H,), 0),
           prefix + mixer + "out_proj.weight": (block + "ssm_out.weight", (E, inner), 0)}
    if hp.family["conv_bias"]:
        out[prefix + mixer + "conv1d.bias"] = (block + "ssm_conv1d.bias", (conv,), 0)
    return out


def _mamba2_transformed(hp, prefix, block, mixer):
    h = hp.family
    H, G = h["n_head"], h["n_group"]
    inner, conv = _mamba2_dims(hp)
    p = prefix + mixer

    def one(gguf, hf, shape, hf_shape, fn):
        return ExpertTensor(block + gguf, shape, ((p + hf, hf_shape),), lambda xs: fn(xs[0]))

    return [one("ssm_conv1d.weight", "conv1d.weight", (conv, h["kernel"]), (conv, 1, h["kernel"]),
                lambda w: np.ascontiguousarray(w[:, 0])),
            one("ssm_a", "A_log", (H, 1), (H,), lambda w: -np.exp(w).reshape(H, 1)),
            one("ssm_d", "D", (H, 1), (H,), lambda w: w.reshape(H, 1)),
            one("ssm_norm.weight", "norm.weight", (G, inner // G), (inner,), lambda w: w.reshape(G, inner // G))]


def nemotron_h_tensors(hp):
    """HF name -> (GGUF name, shape, heads to permute) of every layer's tensors stored as they are."""
    E = hp.n_embd
    out = {}
    for i, kind in enumerate(hp.family["kinds"]):
        p, b = f"backbone.layers.{i}.", f"blk.{i}."
        out[p + "norm.weight"] = (b + "attn_norm.weight", (E,), 0)
        if kind == "mamba":
            out.update(_mamba2_plain(hp, p, b, "mixer."))
        elif kind == "attention":
            out.update(_attention(hp, p, b, "mixer."))
        elif kind == "mlp":
            out[p + "mixer.up_proj.weight"] = (b + "ffn_up.weight", (hp.n_ff, E), 0)
            out[p + "mixer.down_proj.weight"] = (b + "ffn_down.weight", (E, hp.n_ff), 0)
        else:
            X, F = hp.int_keys["expert_count"], hp.int_keys["expert_shared_feed_forward_length"]
            out[p + "mixer.gate.weight"] = (b + "ffn_gate_inp.weight", (X, E), 0)
            out[p + "mixer.gate.e_score_correction_bias"] = (b + "exp_probs_b.bias", (X,), 0)
            out[p + "mixer.shared_experts.up_proj.weight"] = (b + "ffn_up_shexp.weight", (F, E), 0)
            out[p + "mixer.shared_experts.down_proj.weight"] = (b + "ffn_down_shexp.weight", (E, F), 0)
    return out


def nemotron_h_transformed(hp):
    """The Mamba2 tensors llama.cpp changes, and each mixture layer's experts stacked."""
    out = []
    for i, kind in enumerate(hp.family["kinds"]):
        p, b = f"backbone.layers.{i}.", f"blk.{i}."
        if kind == "mamba":
            out += _mamba2_transformed(hp, p, b, "mixer.")
        elif kind == "moe":
            E, X, F = hp.n_embd, hp.int_keys["expert_count"], hp.int_keys["expert_feed_forward_length"]
            for proj, shape in (("up", (F, E)), ("down", (E, F))):
                names = tuple((f"{p}mixer.experts.{e}.{proj}_proj.weight", shape) for e in range(X))
                out.append(ExpertTensor(f"{b}ffn_{proj}_exps.weight", (X, *shape), names, np.stack))
    return out


def _shared_width(hp):
    return hp.int_keys["expert_shared_feed_forward_length"]


def granite_hybrid_tensors(hp):
    E, F, X = hp.n_embd, _shared_width(hp), hp.family["n_expert"]
    shexp = "_shexp" if X else ""
    out = {}
    for i, kind in enumerate(hp.family["kinds"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[p + "input_layernorm.weight"] = (b + "attn_norm.weight", (E,), 0)
        out[p + "post_attention_layernorm.weight"] = (b + "ffn_norm.weight", (E,), 0)
        out[p + "shared_mlp.output_linear.weight"] = (b + f"ffn_down{shexp}.weight", (E, F), 0)
        if X:
            moe = p + "block_sparse_moe."
            out[moe + "router.layer.weight"] = (b + "ffn_gate_inp.weight", (X, E), 0)
            out[moe + "output_linear.weight"] = (b + "ffn_down_exps.weight", (X, E, hp.n_ff), 0)
        out.update(_mamba2_plain(hp, p, b, "mamba.") if kind == "mamba" else _attention(hp, p, b, "self_attn."))
    return out


def granite_hybrid_transformed(hp):
    """The Mamba2 tensors llama.cpp changes, and transformers' fused inputs of the shared_mlp (and of the
    experts) split into the gate (the first half of the rows) and up."""
    E, F, X = hp.n_embd, _shared_width(hp), hp.family["n_expert"]
    shexp = "_shexp" if X else ""
    out = []
    for i, kind in enumerate(hp.family["kinds"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        fused = ((p + "shared_mlp.input_linear.weight", (2 * F, E)),)
        out.append(ExpertTensor(b + f"ffn_gate{shexp}.weight", (F, E), fused, lambda xs: xs[0][:F]))
        out.append(ExpertTensor(b + f"ffn_up{shexp}.weight", (F, E), fused, lambda xs: xs[0][F:]))
        if X:
            G = hp.n_ff
            fused = ((p + "block_sparse_moe.input_linear.weight", (X, 2 * G, E)),)
            out.append(ExpertTensor(b + "ffn_gate_exps.weight", (X, G, E), fused,
                                    lambda xs: np.ascontiguousarray(xs[0][:, :G])))
            out.append(ExpertTensor(b + "ffn_up_exps.weight", (X, G, E), fused,
                                    lambda xs: np.ascontiguousarray(xs[0][:, G:])))
        if kind == "mamba":
            out += _mamba2_transformed(hp, p, b, "mamba.")
    return out
