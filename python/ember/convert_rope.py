"""Rotary position settings of a Hugging Face config -> GGUF, as llama.cpp's converter writes them:
the rope base, linear and YaRN scaling as {arch}.rope.scaling.* keys, and llama 3's scaling as the
rope_freqs.weight tensor of per-pair frequency divisors. Reads both config spellings: transformers
5's rope_parameters (flat, or split by layer type) and the older rope_scaling + rope_theta."""
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .convert_error import ConvertError

SCALINGS = ("linear", "yarn", "llama3")


@dataclass
class Rope:
    base: float
    scaling: str = "none"                 # "none" or one of SCALINGS
    factor: float = 1.0
    orig_ctx: Optional[int] = None        # yarn / llama3: the pre-training context length
    low_freq_factor: float = 1.0          # llama3
    high_freq_factor: float = 4.0         # llama3
    yarn_ext_factor: Optional[float] = None
    yarn_attn_factor: Optional[float] = None
    yarn_beta_fast: Optional[float] = None
    yarn_beta_slow: Optional[float] = None
    yarn_log_mul: Optional[float] = None   # YaRN's mscale_all_dim (rope.scaling.yarn_log_multiplier)


def split_rope_params(config):
    """(global params, sliding-layer params or None) as flat dicts with rope_type and rope_theta."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        return dict(params.get("full_attention") or {}), params.get("sliding_attention")
    flat = dict(params or config.get("rope_scaling") or {})
    if "rope_type" not in flat and "type" in flat:
        flat["rope_type"] = flat["type"]   # the pre-4.45 transformers spelling
    if "rope_theta" not in flat and "rope_theta" in config:
        flat["rope_theta"] = config["rope_theta"]
    local = None
    if "rope_local_base_freq" in config:   # Gemma 3 before rope_parameters
        local = {"rope_type": "default", "rope_theta": config["rope_local_base_freq"]}
    return flat, local


def _number(params, key, path, kind, cast=float):
    if params.get(key) is None:
        raise ConvertError(f"{path}: rope scaling '{kind}' is missing '{key}'")
    try:
        value = cast(params[key])
    except (TypeError, ValueError):
        raise ConvertError(f"{path}: rope scaling '{kind}' has a non-numeric '{key}': {params[key]!r}") from None
    if not value > 0:
        raise ConvertError(f"{path}: rope scaling '{kind}' needs a positive '{key}', got {params[key]!r}")
    return value


def _optional(params, *keys):
    for k in keys:
        if params.get(k) is not None:
            return float(params[k])
    return None


def read_rope(params, default_base, path, allowed=SCALINGS, what="rope scaling", unrounded_yarn=False,
              yarn_mscale=False):
    """params: one flat rope dict (see split_rope_params). allowed: the scalings this architecture's
    GGUF can express; anything else is refused, since a file that runs with the wrong positions is
    worse than none. unrounded_yarn: the architecture's YaRN keeps its correction range unrounded
    (gpt-oss), so its configs must say truncate=false. yarn_mscale: the architecture's GGUF carries
    YaRN's mscale_all_dim (Mistral 3; mscale must then be 1, as llama.cpp assumes)."""
    kind = params.get("rope_type") or "default"
    rope = Rope(base=float(params.get("rope_theta", default_base)))
    if kind == "default":
        return rope
    if kind not in allowed:
        raise ConvertError(f"{path}: unsupported {what} '{kind}' "
                           f"(ember-convert writes: {', '.join(allowed) or 'none'})")
    if kind in ("longrope", "su", "proportional"):
        # LongRoPE's factors, Gemma 4's partial rotary: tensors and keys of the architecture's own
        # (convert_fused.py, convert_gemma4.py).
        return rope
    rope.scaling = kind
    rope.factor = _number(params, "factor", path, kind)
    if kind == "llama3":
        rope.low_freq_factor = _number(params, "low_freq_factor", path, kind)
        rope.high_freq_factor = _number(params, "high_freq_factor", path, kind)
        rope.orig_ctx = _number(params, "original_max_position_embeddings", path, kind, int)
        if rope.low_freq_factor == rope.high_freq_factor:
            raise ConvertError(f"{path}: rope scaling 'llama3' needs low_freq_factor != high_freq_factor")
    elif kind == "yarn":
        rope.orig_ctx = _number(params, "original_max_position_embeddings", path, kind, int)
        if yarn_mscale and params.get("mscale_all_dim") is not None:
            # llama.cpp's mistral3 assumes mscale 1; its deepseek2 (yarn_mscale "equal") mscale == mscale_all_dim.
            equal = yarn_mscale == "equal"
            want = params["mscale_all_dim"] if equal else 1.0
            if params.get("mscale", None if equal else 1.0) != want:
                raise ConvertError(f"{path}: rope scaling 'yarn' with mscale {params.get('mscale')!r} is not supported "
                                   f"(llama.cpp's file assumes {'mscale_all_dim' if equal else '1'})")
            rope.yarn_log_mul = _number(params, "mscale_all_dim", path, kind)
        else:
            for unsupported in ("mscale", "mscale_all_dim"):
                if params.get(unsupported) is not None:
                    raise ConvertError(f"{path}: rope scaling 'yarn' with '{unsupported}' is not supported")
        truncate = params.get("truncate", True)
        if unrounded_yarn and truncate is not False:
            raise ConvertError(f"{path}: rope scaling 'yarn' must have truncate=false here (the architecture "
                               "keeps the correction range unrounded)")
        if not unrounded_yarn and truncate is False:
            # GGUF's YaRN rounds the correction range to whole dimensions.
            raise ConvertError(f"{path}: rope scaling 'yarn' with truncate=false is not supported")
        rope.yarn_ext_factor = _optional(params, "extrapolation_factor")
        rope.yarn_attn_factor = _optional(params, "attention_factor", "attn_factor")
        rope.yarn_beta_fast = _optional(params, "beta_fast")
        rope.yarn_beta_slow = _optional(params, "beta_slow")
    return rope


def add_rope_scaling(writer, rope):
    """The {arch}.rope.scaling.* keys (llama3 has none: its scaling is the rope_freqs tensor)."""
    import gguf

    if rope.scaling == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope.factor)
    elif rope.scaling == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope.factor)
        writer.add_rope_scaling_orig_ctx_len(rope.orig_ctx)
        # Only what the config gives: the runtime takes llama.cpp's defaults for the rest.
        for value, add in ((rope.yarn_ext_factor, writer.add_rope_scaling_yarn_ext_factor),
                           (rope.yarn_attn_factor, writer.add_rope_scaling_yarn_attn_factor),
                           (rope.yarn_beta_fast, writer.add_rope_scaling_yarn_beta_fast),
                           (rope.yarn_beta_slow, writer.add_rope_scaling_yarn_beta_slow),
                           (rope.yarn_log_mul, writer.add_rope_scaling_yarn_log_mul)):
            if value is not None:
                add(value)


def llama3_rope_divisors(rope, head_dim):
    """rope_freqs.weight [head_dim/2]: each pair's frequency is divided by its entry. Pairs whose
    wavelength is under orig_ctx/high_freq_factor keep their frequency (1), those over
    orig_ctx/low_freq_factor are divided by factor, and those between blend the two smoothly.
    Computed in float32 like llama.cpp's converter, so the files agree bit for bit."""
    f32 = np.float32
    exps = np.arange(0, head_dim, 2, dtype=f32) / f32(head_dim)
    freqs = (f32(1.0) / np.power(f32(rope.base), exps)).astype(f32)
    wavelen = (f32(2 * math.pi) / freqs).astype(f32)
    low_wavelen = rope.orig_ctx / rope.low_freq_factor
    high_wavelen = rope.orig_ctx / rope.high_freq_factor
    smooth = ((f32(rope.orig_ctx) / wavelen - f32(rope.low_freq_factor))
              / f32(rope.high_freq_factor - rope.low_freq_factor)).astype(f32)
    blended = (f32(1.0) / ((f32(1.0) - smooth) / f32(rope.factor) + smooth)).astype(f32)
    out = np.where(wavelen < high_wavelen, f32(1.0), np.where(wavelen > low_wavelen, f32(rope.factor), blended))
    return out.astype(f32)
