"""ember-convert's Llama 4 text model (Llama4ForCausalLM), as llama.cpp's converter writes it: dense and
mixture layers interleaved (interleave_moe_layer_step), the experts' fused gate_up_proj split into
ffn_gate_exps / ffn_up_exps, a shared expert per mixture layer, the chunk of the chunked layers as
attention.sliding_window, and the NoPE layers' attention temperature as attention.temperature_scale /
temperature_length (keys llama.cpp reads for other families; its llama4 fixes 0.1 and 8192). What a
llama4 file cannot say (another NoPE or chunk pattern, q/k norms against llama.cpp's rule) is refused."""
import numpy as np

from .convert_error import ConvertError
from .convert_moe import Experts, ExpertTensor

_NO_ROPE_PERIOD = 4


def _positive_int(config, key, path, default=None):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConvertError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return value


def read_llama4(config, hp, path):
    n_expert = _positive_int(config, "num_local_experts", path)
    n_used = _positive_int(config, "num_experts_per_tok", path)
    if n_used > n_expert:
        raise ConvertError(f"{path}: num_experts_per_tok={n_used} exceeds num_local_experts={n_expert}")
    hp.experts = Experts(n_expert, n_used, _positive_int(config, "intermediate_size", path))
    hp.n_ff = _positive_int(config, "intermediate_size_mlp", path)
    step = _positive_int(config, "interleave_moe_layer_step", path, 1)
    moe = [(i + 1) % step == 0 for i in range(hp.n_layer)]
    layers = config.get("moe_layers")
    if layers is not None and sorted(layers) != [i for i in range(hp.n_layer) if moe[i]]:
        raise ConvertError(f"{path}: 'moe_layers' {layers} is not every interleave_moe_layer_step={step}-th layer "
                           "(the only pattern a llama4 file can say)")
    hp.int_keys["interleave_moe_layer_step"] = step
    hp.family["moe"] = moe

    types = config.get("layer_types") or []
    chunked = any(t == "chunked_attention" for t in types)
    if chunked:
        hp.n_swa = _positive_int(config, "attention_chunk_size", path)
        period = _NO_ROPE_PERIOD
    else:
        hp.write_swa = True   # sliding_window 0: no chunks, as llama.cpp's converter says it
        period = hp.n_layer
    rope_layers = [(i + 1) % period != 0 for i in range(hp.n_layer)]
    want_types = ["chunked_attention" if chunked and r else "full_attention" for r in rope_layers]
    if list(types) != want_types:
        raise ConvertError(f"{path}: 'layer_types' must be {want_types} (a llama4 file's fixed pattern), got {types}")
    no_rope = config.get("no_rope_layers")
    if no_rope is not None and [bool(x) for x in no_rope] != rope_layers:
        raise ConvertError(f"{path}: 'no_rope_layers' must be {[int(r) for r in rope_layers]} (rope on all but every "
                           f"{period}-th layer, a llama4 file's fixed pattern), got {no_rope}")
    # llama.cpp decides q/k norms by the expert count (all but the 128-expert model have them).
    if bool(config.get("use_qk_norm", True)) != (n_expert != 128):
        raise ConvertError(f"{path}: use_qk_norm={config.get('use_qk_norm')} with {n_expert} experts: a llama4 file "
                           "normalizes q and k exactly when there are not 128 experts")
    if config.get("attn_temperature_tuning", True):
        hp.keys["attention.temperature_scale"] = float(config.get("attn_scale", 0.1))
        hp.int_keys["attention.temperature_length"] = _positive_int(config, "floor_scale", path, 8192)
    else:
        hp.keys["attention.temperature_scale"] = 0.0


def llama4_tensors(hp):
    """Every layer's plain tensors: HF name -> (GGUF name, numpy shape, heads to permute with)."""
    q, kv, E = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_embd
    F, FX, X = hp.n_ff, hp.experts.n_ff, hp.experts.n_expert
    out = {}
    for i in range(hp.n_layer):
        t = {
            "input_layernorm.weight": ("attn_norm.weight", (E,)),
            "self_attn.q_proj.weight": ("attn_q.weight", (q, E)),
            "self_attn.k_proj.weight": ("attn_k.weight", (kv, E)),
            "self_attn.v_proj.weight": ("attn_v.weight", (kv, E)),
            "self_attn.o_proj.weight": ("attn_output.weight", (E, q)),
            "post_attention_layernorm.weight": ("ffn_norm.weight", (E,)),
        }
        if hp.family["moe"][i]:
            t["feed_forward.router.weight"] = ("ffn_gate_inp.weight", (X, E))
            for kind, shape in (("gate", (FX, E)), ("up", (FX, E)), ("down", (E, FX))):
                t[f"feed_forward.shared_expert.{kind}_proj.weight"] = (f"ffn_{kind}_shexp.weight", shape)
        else:
            for kind, shape in (("gate", (F, E)), ("up", (F, E)), ("down", (E, F))):
                t[f"feed_forward.{kind}_proj.weight"] = (f"ffn_{kind}.weight", shape)
        out.update({f"model.layers.{i}.{k}": (f"blk.{i}.{g}", s, 0) for k, (g, s) in t.items()})
    return out


def _transposed(cols):
    """HF keeps the experts as x @ W ([X, in, out]); GGUF's are [X, out, in] (numpy order)."""
    return lambda arrays: np.ascontiguousarray(np.swapaxes(arrays[0][:, :, cols], -1, -2))


def llama4_expert_tensors(hp):
    """The mixture layers' stacked experts: gate_up_proj [X, E, 2F] holds gate then up along its last axis."""
    E, FX, X = hp.n_embd, hp.experts.n_ff, hp.experts.n_expert
    out = []
    for i in range(hp.n_layer):
        if not hp.family["moe"][i]:
            continue
        p, g = f"model.layers.{i}.feed_forward.experts.", f"blk.{i}."
        fused = ((p + "gate_up_proj", (X, E, 2 * FX)),)
        out.append(ExpertTensor(g + "ffn_gate_exps.weight", (X, FX, E), fused, _transposed(slice(0, FX))))
        out.append(ExpertTensor(g + "ffn_up_exps.weight", (X, FX, E), fused, _transposed(slice(FX, None))))
        out.append(ExpertTensor(g + "ffn_down_exps.weight", (X, E, FX), ((p + "down_proj", (X, FX, E)),),
                                _transposed(slice(None))))
    return out
