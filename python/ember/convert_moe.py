"""Mixture-of-experts checkpoints -> GGUF, as llama.cpp's converter writes them: the expert keys
({arch}.expert_count, expert_used_count, expert_feed_forward_length) and each layer's experts
stacked into 3-D ffn_{gate,up,down}_exps tensors, from per-expert checkpoints (Qwen3-MoE, Mixtral)
or from gpt-oss's fused, interleaved gate_up_proj."""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .convert_error import ConvertError


@dataclass(frozen=True)
class ExpertLayout:
    """Where a checkpoint keeps a layer's router and experts (suffixes after model.layers.N.)."""
    router: str
    per_expert: tuple = ()      # (gate, up, down) with {e} for the expert's index; () when fused
    fused: str = ""             # gpt-oss: {fused}.gate_up_proj [X, E, 2F] and {fused}.down_proj [X, F, E]
    biases: bool = False        # the router's and the experts' biases (gpt-oss)
    count_keys: tuple = ("num_local_experts",)
    ff_key: str = "intermediate_size"


QWEN3MOE = ExpertLayout("mlp.gate", ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj",
                                     "mlp.experts.{e}.down_proj"),
                        count_keys=("num_experts", "num_local_experts"), ff_key="moe_intermediate_size")
MIXTRAL = ExpertLayout("block_sparse_moe.gate", ("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w3",
                                                 "block_sparse_moe.experts.{e}.w2"))
GPT_OSS = ExpertLayout("mlp.router", fused="mlp.experts", biases=True)


@dataclass
class Experts:
    n_expert: int
    n_used: int
    n_ff: int
    norm_topk: Optional[bool] = None   # None: the architecture's default (renormalized)


@dataclass(frozen=True)
class ExpertTensor:
    """One GGUF tensor made from checkpoint tensors: inputs (name, numpy shape) are loaded as
    float32 and `combine` makes the GGUF tensor (numpy shape `shape`) of them."""
    gguf_name: str
    shape: tuple
    inputs: tuple
    combine: Callable


def _count(config, keys, path):
    for k in keys:
        v = config.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConvertError(f"{path}: '{k}' must be a positive integer, got {v!r}")
            return v
    raise ConvertError(f"{path}: missing key '{keys[0]}'")


def read_experts(config, layout, n_layer, path):
    """The expert counts and widths of a config; refuses what the GGUF architectures cannot say."""
    n_expert = _count(config, layout.count_keys, path)
    n_used = _count(config, ("num_experts_per_tok",), path)
    if n_used > n_expert:
        raise ConvertError(f"{path}: num_experts_per_tok={n_used} exceeds the number of experts ({n_expert})")
    ex = Experts(n_expert, n_used, _count(config, (layout.ff_key,), path))
    if layout is QWEN3MOE:
        if config.get("decoder_sparse_step", 1) != 1 or config.get("mlp_only_layers"):
            raise ConvertError(f"{path}: dense layers among the mixture ones (decoder_sparse_step, "
                               f"mlp_only_layers) are not supported for qwen3moe")
        # Qwen3MoeConfig's default is false; the released models say true, as llama.cpp assumes.
        ex.norm_topk = bool(config.get("norm_topk_prob", False))
    if config.get("shared_expert_intermediate_size") or config.get("n_shared_experts"):
        raise ConvertError(f"{path}: shared experts are not supported here")
    if layout is GPT_OSS:
        _check_gpt_oss(config, n_layer, path)
    return ex


def _check_gpt_oss(config, n_layer, path):
    q = config.get("quantization_config") or {}
    if q.get("quant_method"):
        raise ConvertError(f"{path}: a {q['quant_method']}-quantized gpt-oss checkpoint; ember-convert reads "
                           "the unquantized one (bf16 or f32 experts, as transformers saves it after "
                           "dequantizing)")
    if float(config.get("swiglu_limit", 7.0)) != 7.0 or float(config.get("swiglu_alpha", 1.702)) != 1.702:
        raise ConvertError(f"{path}: gpt-oss with swiglu_limit {config.get('swiglu_limit')} / swiglu_alpha "
                           f"{config.get('swiglu_alpha')}: the GGUF architecture fixes them at 7.0 and 1.702")
    types = config.get("layer_types")
    alternating = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layer)]
    if types is not None and list(types) != alternating:
        raise ConvertError(f"{path}: gpt-oss 'layer_types' must alternate sliding_attention, full_attention "
                           "(the GGUF architecture's fixed pattern)")
    if not config.get("attention_bias", True):
        raise ConvertError(f"{path}: gpt-oss without attention biases (attention_bias=false) is not supported")


def add_expert_keys(writer, spec, ex):
    writer.add_expert_count(ex.n_expert)
    writer.add_expert_used_count(ex.n_used)
    if spec.experts is not MIXTRAL:   # llama.cpp's llama files take the width from feed_forward_length
        writer.add_expert_feed_forward_length(ex.n_ff)
    if ex.norm_topk is False:
        writer.add_expert_weights_norm(False)


def _stack(arrays):
    return np.stack(arrays)


def _transposed(rows):
    """gpt-oss stores x @ W ([X, in, out]); GGUF's matrices are [X, out, in] (numpy order)."""
    def f(arrays):
        w = np.swapaxes(arrays[0], -1, -2)
        return np.ascontiguousarray(w[:, rows] if rows is not None else w)
    return f


def _bias_rows(rows):
    def f(arrays):
        return np.ascontiguousarray(arrays[0][:, rows])
    return f


def expert_tensors(layout, hp, ex, layer):
    """The GGUF tensors of layer `layer`'s router and experts, and the checkpoint tensors each is made of."""
    E, F, X = hp.n_embd, ex.n_ff, ex.n_expert
    p, g = f"model.layers.{layer}.", f"blk.{layer}."
    out = [ExpertTensor(g + "ffn_gate_inp.weight", (X, E), ((p + layout.router + ".weight", (X, E)),),
                        lambda a: a[0])]
    if layout.biases:
        out.append(ExpertTensor(g + "ffn_gate_inp.bias", (X,), ((p + layout.router + ".bias", (X,)),),
                                lambda a: a[0]))
    if layout.per_expert:
        shapes = ((F, E), (F, E), (E, F))
        for kind, template, shape in zip(("gate", "up", "down"), layout.per_expert, shapes):
            names = tuple((p + template.format(e=e) + ".weight", shape) for e in range(X))
            out.append(ExpertTensor(f"{g}ffn_{kind}_exps.weight", (X, *shape), names, _stack))
        return out
    # gpt-oss: gate and up are interleaved columns of gate_up_proj (gate even, up odd), as are their biases.
    fused, fused_bias = p + layout.fused + ".gate_up_proj", p + layout.fused + ".gate_up_proj_bias"
    down, down_bias = p + layout.fused + ".down_proj", p + layout.fused + ".down_proj_bias"
    for kind, rows in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
        out.append(ExpertTensor(f"{g}ffn_{kind}_exps.weight", (X, F, E), ((fused, (X, E, 2 * F)),), _transposed(rows)))
        out.append(ExpertTensor(f"{g}ffn_{kind}_exps.bias", (X, F), ((fused_bias, (X, 2 * F)),), _bias_rows(rows)))
    out.append(ExpertTensor(g + "ffn_down_exps.weight", (X, E, F), ((down, (X, F, E)),), _transposed(None)))
    out.append(ExpertTensor(g + "ffn_down_exps.bias", (X, E), ((down_bias, (X, E)),), lambda a: a[0]))
    return out
