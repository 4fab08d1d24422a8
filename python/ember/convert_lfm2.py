"""LFM2 checkpoints (Liquid: short-convolution layers beside GQA attention with per-head q/k norms) -> GGUF,
as llama.cpp's converter writes them: head_count_kv one a layer with 0 marking a convolution layer,
shortconv.l_cache, the feed-forward width block_auto_adjust_ff_dim makes, each convolution squeezed to
[n_embd][L_cache], and the final norm (embedding_norm) as token_embd_norm. LFM2-MoE (lfm2moe): after
num_dense_layers dense feed-forwards, per-expert w1/w3/w2 stacked, the router and its expert_bias
(exp_probs_b), sigmoid gating (expert_gating_func 2)."""
from .convert_error import ConvertError
from .convert_moe import ExpertLayout, ExpertTensor, expert_tensors

# The config keys older LFM2 checkpoints spell their own way, as transformers renames them.
ALIASES = {"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings", "norm_eps": "rms_norm_eps"}
FINAL_NORM = ("model.embedding_norm.weight", "token_embd_norm.weight")
LFM2MOE = ExpertLayout("feed_forward.gate", ("feed_forward.experts.{e}.w1", "feed_forward.experts.{e}.w3",
                                             "feed_forward.experts.{e}.w2"),
                       count_keys=("num_experts",), ff_key="moe_intermediate_size")


def _layer_types(config, n_layer, path):
    """True for each convolution layer: from layer_types, else from full_attn_idxs (the attention layers)."""
    types = config.get("layer_types")
    if types is None:
        attn = config.get("full_attn_idxs")
        if attn is None:
            attn = range(n_layer)
        if not isinstance(attn, (list, range)) or any(isinstance(i, bool) or not isinstance(i, int) or
                                                       not 0 <= i < n_layer for i in attn):
            raise ConvertError(f"{path}: 'full_attn_idxs' must list layers below num_hidden_layers={n_layer}, "
                               f"got {attn!r}")
        return [i not in attn for i in range(n_layer)]
    if not isinstance(types, list) or len(types) != n_layer:
        raise ConvertError(f"{path}: 'layer_types' must have num_hidden_layers={n_layer} entries, got {types!r}")
    for t in types:
        if t not in ("conv", "full_attention"):
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layer_types' (conv, full_attention)")
    return [t == "conv" for t in types]


def _ff_width(config, n_ff, path):
    """The SwiGLU width LFM2's MLP builds from intermediate_size when block_auto_adjust_ff_dim is on:
    two thirds of it, times block_ffn_dim_multiplier, rounded up to block_multiple_of."""
    if not config.get("block_auto_adjust_ff_dim", True):
        return n_ff
    n_ff = int(2 * n_ff / 3)
    multiplier = config.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is None:
        return n_ff
    multiple = config.get("block_multiple_of", 256)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple <= 0:
        raise ConvertError(f"{path}: 'block_multiple_of' must be a positive integer, got {multiple!r}")
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or multiplier <= 0:
        raise ConvertError(f"{path}: 'block_ffn_dim_multiplier' must be a positive number, got {multiplier!r}")
    n_ff = int(multiplier * n_ff)
    return multiple * ((n_ff + multiple - 1) // multiple)


def _read_layers(config, hp, path, n_dense):
    if config.get("conv_bias"):
        raise ConvertError(f"{path}: conv_bias=true is not supported (llama.cpp's lfm2 has no such biases)")
    kernel = config.get("conv_L_cache", 3)
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 2:
        raise ConvertError(f"{path}: 'conv_L_cache' must be an integer of at least 2, got {kernel!r}")
    conv = _layer_types(config, hp.n_layer, path)
    hp.family = dict(conv=conv, kernel=kernel, n_dense=n_dense)
    hp.int_keys["shortconv.l_cache"] = kernel
    hp.n_head_kv_layer = [0 if c else hp.n_head_kv for c in conv]


def read_lfm2(config, hp, path):
    """The layer kinds, the convolution's length and the feed-forward width of an LFM2 config."""
    _read_layers(config, hp, path, hp.n_layer)
    hp.n_ff = _ff_width(config, hp.n_ff, path)


def read_lfm2moe(config, hp, path):
    """read_lfm2's, less the width adjustment, and the mixture's: the leading dense layers and the routing
    llama.cpp's lfm2moe fixes (sigmoid scores chosen with the expert bias, renormalized, unscaled)."""
    n_dense = config.get("num_dense_layers", 2)
    if isinstance(n_dense, bool) or not isinstance(n_dense, int) or not 0 <= n_dense <= hp.n_layer:
        raise ConvertError(f"{path}: 'num_dense_layers' must be an integer from 0 to num_hidden_layers={hp.n_layer}, "
                           f"got {n_dense!r}")
    for key, want in (("use_expert_bias", True), ("norm_topk_prob", True), ("routed_scaling_factor", 1.0)):
        if config.get(key, want) != want:
            raise ConvertError(f"{path}: {key}={config[key]!r} is not supported for lfm2moe (llama.cpp's lfm2moe "
                               f"assumes {want})")
    _read_layers(config, hp, path, n_dense)
    hp.int_keys.update({"leading_dense_block_count": n_dense, "expert_gating_func": 2})


def lfm2_tensors(hp):
    """Every layer's tensors stored as the checkpoint has them: HF name -> (GGUF name, shape, 0)."""
    E, F, D = hp.n_embd, hp.n_ff, hp.head_dim
    q, kv = hp.n_head * D, hp.n_head_kv * D
    out = {}
    for i, conv in enumerate(hp.family["conv"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        plain = {"operator_norm.weight": ("attn_norm.weight", (E,)), "ffn_norm.weight": ("ffn_norm.weight", (E,))}
        if i < hp.family["n_dense"]:
            plain.update({"feed_forward.w1.weight": ("ffn_gate.weight", (F, E)),
                          "feed_forward.w3.weight": ("ffn_up.weight", (F, E)),
                          "feed_forward.w2.weight": ("ffn_down.weight", (E, F))})
        else:   # the router and experts are ExpertTensors (lfm2_transformed)
            plain["feed_forward.expert_bias"] = ("exp_probs_b.bias", (hp.experts.n_expert,))
        if conv:
            plain.update({"conv.in_proj.weight": ("shortconv.in_proj.weight", (3 * E, E)),
                          "conv.out_proj.weight": ("shortconv.out_proj.weight", (E, E))})
        else:
            plain.update({"self_attn.q_proj.weight": ("attn_q.weight", (q, E)),
                          "self_attn.k_proj.weight": ("attn_k.weight", (kv, E)),
                          "self_attn.v_proj.weight": ("attn_v.weight", (kv, E)),
                          "self_attn.out_proj.weight": ("attn_output.weight", (E, q)),
                          "self_attn.q_layernorm.weight": ("attn_q_norm.weight", (D,)),
                          "self_attn.k_layernorm.weight": ("attn_k_norm.weight", (D,))})
        for hf, (gguf, shape) in plain.items():
            out[p + hf] = (b + gguf, shape, 0)
    return out


def lfm2_transformed(hp):
    """Each convolution layer's depthwise kernel [n_embd][1][L] squeezed to [n_embd][L]; each mixture
    layer's router and stacked experts."""
    E, L = hp.n_embd, hp.family["kernel"]
    out = []
    for i, conv in enumerate(hp.family["conv"]):
        if conv:
            out.append(ExpertTensor(f"blk.{i}.shortconv.conv.weight", (E, L),
                                    ((f"model.layers.{i}.conv.conv.weight", (E, 1, L)),), lambda xs: xs[0][:, 0, :]))
        if i >= hp.family["n_dense"]:
            out += expert_tensors(LFM2MOE, hp, hp.experts, i)
    return out
