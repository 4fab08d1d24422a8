"""Hybrid checkpoints (Qwen3.5 dense and MoE, Qwen3-Next: gated DeltaNet layers beside gated
attention) -> GGUF, as llama.cpp's converter writes them: the ssm.* keys and the recurrent-layer list,
each layer's own tensors, -exp(A_log) stored as ssm_a, the (1 + w) RMSNorms stored as the sum, the
multi-token-prediction blocks (mtp.*) as extra blocks after the trunk (nextn_predict_layers), and the
mixtures' stacked experts beside a gated shared expert. Qwen3.5's DeltaNet v heads are reordered from
grouped by k head to tiled (v head j reads k head j % n_k); Qwen3-Next's stay grouped, its fused
in_proj_qkvz split into attn_qkv and attn_gate and its in_proj_ba kept whole as ssm_ba."""
import os
import re

import numpy as np

from .convert_error import ConvertError
from .convert_moe import ExpertTensor, Experts
from .convert_safetensors import Checkpoint


def _positive_int(config, key, path):
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConvertError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return value


def read_qwen35(config, hp, path):
    """The DeltaNet shapes, the layer kinds and the partial rotary of a Qwen3.5 text config."""
    _read_hybrid(config, hp, path, experts=False, grouped=False)


def read_qwen35moe(config, hp, path):
    """A Qwen3.5/3.6 MoE text config: Qwen3.5's, and its experts and shared expert."""
    _read_hybrid(config, hp, path, experts=True, grouped=False)


def read_qwen3next(config, hp, path):
    """A Qwen3-Next config: Qwen3.5-MoE's keys less the M-RoPE sections; every layer a mixture."""
    if config.get("decoder_sparse_step", 1) != 1 or config.get("mlp_only_layers"):
        raise ConvertError(f"{path}: dense layers among the mixture ones (decoder_sparse_step, mlp_only_layers) "
                           "are not supported for qwen3next (llama.cpp's needs experts in every layer)")
    if config.get("norm_topk_prob", True) is False:
        raise ConvertError(f"{path}: norm_topk_prob=false is not supported for qwen3next (its GGUF architecture "
                           "always renormalizes the chosen experts' weights)")
    n_mtp = config.get("mtp_num_hidden_layers")
    if n_mtp is None:   # Qwen3-Next's configs leave it out; llama.cpp counts the checkpoint's MTP blocks
        stored = (re.match(r"mtp\.layers\.(\d+)\.", n) for n in Checkpoint(os.path.dirname(path)).names())
        n_mtp = max((int(m.group(1)) + 1 for m in stored if m), default=0)
    _read_hybrid(config, hp, path, experts=True, grouped=True, n_mtp=n_mtp)


def _read_experts(config, hp, path):
    ex = Experts(*(_positive_int(config, k, path) for k in ("num_experts", "num_experts_per_tok",
                                                            "moe_intermediate_size")))
    if ex.n_used > ex.n_expert:
        raise ConvertError(f"{path}: num_experts_per_tok={ex.n_used} exceeds num_experts={ex.n_expert}")
    shared = _positive_int(config, "shared_expert_intermediate_size", path)
    hp.experts = ex
    # The blocks have no dense feed-forward: feed_forward_length is the shared expert's width too.
    hp.n_ff = shared
    hp.int_keys["expert_shared_feed_forward_length"] = shared
    return shared


def _read_hybrid(config, hp, path, experts, grouped, n_mtp=None):
    n_k = _positive_int(config, "linear_num_key_heads", path)
    n_v = _positive_int(config, "linear_num_value_heads", path)
    dk = _positive_int(config, "linear_key_head_dim", path)
    dv = _positive_int(config, "linear_value_head_dim", path)
    kernel = _positive_int(config, "linear_conv_kernel_dim", path)
    if n_v % n_k:
        raise ConvertError(f"{path}: linear_num_value_heads={n_v} is not a multiple of linear_num_key_heads={n_k}")
    types = config.get("layer_types")
    if types is None:
        every = config.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(hp.n_layer)]
    if len(types) != hp.n_layer:
        raise ConvertError(f"{path}: 'layer_types' has {len(types)} entries, expected num_hidden_layers={hp.n_layer}")
    for t in types:
        if t not in ("linear_attention", "full_attention"):
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layer_types'")
    params = config.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConvertError(f"{path}: 'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    hp.n_rot = int(hp.head_dim * factor)
    if hp.n_rot % 2 or hp.n_rot <= 0:
        raise ConvertError(f"{path}: partial_rotary_factor {factor} rotates {hp.n_rot} dimensions of a head of "
                           f"{hp.head_dim}; must be even and positive")
    sections = list(params.get("mrope_section") or [11, 11, 10])
    n_mtp = (config.get("mtp_num_hidden_layers") if n_mtp is None else n_mtp) or 0
    if isinstance(n_mtp, bool) or not isinstance(n_mtp, int) or n_mtp < 0:
        raise ConvertError(f"{path}: 'mtp_num_hidden_layers' must be an integer >= 0, got {n_mtp!r}")
    # The MTP blocks follow the trunk's as blocks of their own (full attention), as llama.cpp stores them.
    recurrent = [t == "linear_attention" for t in types] + [False] * n_mtp
    hp.family = dict(n_k=n_k, n_v=n_v, dk=dk, dv=dv, kernel=kernel, recurrent=recurrent, n_trunk=hp.n_layer,
                     grouped=grouped, shared=_read_experts(config, hp, path) if experts else 0)
    hp.n_layer += n_mtp
    if n_mtp:
        hp.int_keys["nextn_predict_layers"] = n_mtp
    hp.int_keys.update({"ssm.conv_kernel": kernel, "ssm.state_size": dk, "ssm.group_count": n_k,
                        "ssm.time_step_rank": n_v, "ssm.inner_size": dv * n_v,
                        "full_attention_interval": int(config.get("full_attention_interval", 4))})
    hp.array_keys["attention.recurrent_layers"] = recurrent
    if not grouped:   # Qwen3-Next's rope is plain NeoX
        hp.array_keys["rope.dimension_sections"] = (sections + [0, 0, 0, 0])[:4]


def _prefix(hp, i):
    """Where the checkpoint keeps block i: the trunk's layers, then the MTP blocks' (mtp.layers.j)."""
    n = hp.family["n_trunk"]
    return f"model.layers.{i}." if i < n else f"mtp.layers.{i - n}."


def tiled_v_heads(w, axis, n_k, n_v, width):
    """The v heads along `axis` (n_v heads of `width`), grouped by k head in the checkpoint
    ([k0: v0..v{r-1}], [k1: ...]), put in tiled order (v0 of every k head, then v1, ...)."""
    w = np.moveaxis(w, axis, 0)
    rest = w.shape[1:]
    w = w.reshape(n_k, n_v // n_k, width, *rest).swapaxes(0, 1).reshape(n_v * width, *rest)
    return np.ascontiguousarray(np.moveaxis(w, 0, axis))


def qwen35_tensors(hp):
    """Every layer's tensors stored as the checkpoint has them: HF name -> (GGUF name, shape, 0)."""
    h = hp.family
    E, F, D = hp.n_embd, hp.n_ff, hp.head_dim
    q, kv = hp.n_head * D, hp.n_head_kv * D
    out = {}
    for i in range(hp.n_layer):
        p, b = _prefix(hp, i), f"blk.{i}."
        if hp.experts:
            S = h["shared"]
            plain = {"mlp.gate.weight": ("ffn_gate_inp.weight", (hp.experts.n_expert, E)),
                     "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", (S, E)),
                     "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", (S, E)),
                     "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", (E, S)),
                     "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", (1, E))}
        else:
            plain = {f"mlp.{k}_proj.weight": (f"ffn_{k}.weight", (E, F) if k == "down" else (F, E))
                     for k in ("gate", "up", "down")}
        if h["recurrent"][i]:
            plain["linear_attn.norm.weight"] = ("ssm_norm.weight", (h["dv"],))
            if h["grouped"]:   # stored as the checkpoint has them, v heads grouped by k head
                value = h["n_v"] * h["dv"]
                plain.update({"linear_attn.in_proj_ba.weight": ("ssm_ba.weight", (2 * h["n_v"], E)),
                              "linear_attn.dt_bias": ("ssm_dt.bias", (h["n_v"],)),
                              "linear_attn.out_proj.weight": ("ssm_out.weight", (E, value))})
        else:
            plain.update({"self_attn.q_proj.weight": ("attn_q.weight", (2 * q, E)),
                          "self_attn.k_proj.weight": ("attn_k.weight", (kv, E)),
                          "self_attn.v_proj.weight": ("attn_v.weight", (kv, E)),
                          "self_attn.o_proj.weight": ("attn_output.weight", (E, q))})
        for hf, (gguf, shape) in plain.items():
            out[p + hf] = (b + gguf, shape, 0)
        if i == h["n_trunk"]:   # the first MTP block holds the MTP head's own tensors, as llama.cpp maps them
            out["mtp.fc.weight"] = (b + "nextn.eh_proj.weight", (E, 2 * E), 0)
    return out


def _stacked_experts(hp, i):
    """Block i's routed experts (mlp.experts.{e}.*_proj) stacked into ffn_{gate,up,down}_exps."""
    E, X, F = hp.n_embd, hp.experts.n_expert, hp.experts.n_ff
    p, b = _prefix(hp, i), f"blk.{i}."
    out = []
    for kind, shape in (("gate", (F, E)), ("up", (F, E)), ("down", (E, F))):
        names = tuple((f"{p}mlp.experts.{e}.{kind}_proj.weight", shape) for e in range(X))
        out.append(ExpertTensor(f"{b}ffn_{kind}_exps.weight", (X, *shape), names, np.stack))
    return out


def _qwen3next_qkvz(h):
    """in_proj_qkvz keeps, per k head, its q, k, then its v heads' v and z rows: q, k and v of every
    head become attn_qkv (all q, all k, all v, the v heads grouped by k head) and z attn_gate."""
    n_k, dk, vz = h["n_k"], h["dk"], h["n_v"] // h["n_k"] * h["dv"]

    def split(w):
        w = w.reshape(n_k, 2 * dk + 2 * vz, -1)
        parts = np.split(w, [dk, 2 * dk, 2 * dk + vz], axis=1)
        return [x.reshape(-1, w.shape[-1]) for x in parts]

    return (lambda w: np.concatenate(split(w)[:3])), (lambda w: np.ascontiguousarray(split(w)[3]))


def qwen35_transformed(hp):
    """Every layer's tensors that llama.cpp's converter changes, as ExpertTensors: the (1 + w) norms,
    the DeltaNet tensors (Qwen3.5's with tiled v heads, Qwen3-Next's in_proj_qkvz split), the squeezed
    convolution, ssm_a = -exp(A_log), and a mixture's stacked experts."""
    h = hp.family
    E, D = hp.n_embd, hp.head_dim
    n_k, n_v, dk, dv = h["n_k"], h["n_v"], h["dk"], h["dv"]
    key, value = n_k * dk, n_v * dv
    out = []
    for i in range(hp.n_layer):
        p, b = _prefix(hp, i), f"blk.{i}."

        def add(gguf, hf, shape, fn, hf_shape=None):
            out.append(ExpertTensor(b + gguf, shape, ((p + hf, hf_shape or shape),), lambda xs: fn(xs[0])))

        if hp.experts:
            out.extend(_stacked_experts(hp, i))
        plus_one = lambda w: w + np.float32(1)   # noqa: E731
        add("attn_norm.weight", "input_layernorm.weight", (E,), plus_one)
        add("post_attention_norm.weight", "post_attention_layernorm.weight", (E,), plus_one)
        if not h["recurrent"][i]:
            add("attn_q_norm.weight", "self_attn.q_norm.weight", (D,), plus_one)
            add("attn_k_norm.weight", "self_attn.k_norm.weight", (D,), plus_one)
            if i == h["n_trunk"]:
                for gguf, hf in (("enorm", "pre_fc_norm_embedding"), ("hnorm", "pre_fc_norm_hidden"),
                                 ("shared_head_norm", "norm")):
                    out.append(ExpertTensor(f"{b}nextn.{gguf}.weight", (E,), ((f"mtp.{hf}.weight", (E,)),),
                                            lambda xs: plus_one(xs[0])))
            continue

        la, C = "linear_attn.", 2 * key + value
        if h["grouped"]:
            qkv, z = _qwen3next_qkvz(h)
            add("attn_qkv.weight", la + "in_proj_qkvz.weight", (C, E), qkv, hf_shape=(C + value, E))
            add("attn_gate.weight", la + "in_proj_qkvz.weight", (value, E), z, hf_shape=(C + value, E))
            add("ssm_conv1d.weight", la + "conv1d.weight", (C, h["kernel"]), lambda w: np.ascontiguousarray(w[:, 0]),
                hf_shape=(C, 1, h["kernel"]))
            add("ssm_a", la + "A_log", (n_v,), lambda w: -np.exp(w))
            continue

        def v_rows(width, skip=0):
            return lambda w: np.concatenate([w[:skip], tiled_v_heads(w[skip:], 0, n_k, n_v, width)])

        add("attn_qkv.weight", la + "in_proj_qkv.weight", (C, E), v_rows(dv, 2 * key))
        add("attn_gate.weight", la + "in_proj_z.weight", (value, E), v_rows(dv))
        add("ssm_conv1d.weight", la + "conv1d.weight", (C, h["kernel"]),
            lambda w: v_rows(dv, 2 * key)(w[:, 0, :]), hf_shape=(C, 1, h["kernel"]))
        add("ssm_dt.bias", la + "dt_bias", (n_v,), v_rows(1))
        add("ssm_a", la + "A_log", (n_v,), lambda w: -np.exp(v_rows(1)(w)))
        add("ssm_beta.weight", la + "in_proj_b.weight", (n_v, E), v_rows(1))
        add("ssm_alpha.weight", la + "in_proj_a.weight", (n_v, E), v_rows(1))
        add("ssm_out.weight", la + "out_proj.weight", (E, value), lambda w: tiled_v_heads(w, 1, n_k, n_v, dv))
    return out
