"""Architectures ember-convert knows: HF config.json -> GGUF hyperparameter keys, and HF tensor
names/shapes -> GGUF tensor names, as llama.cpp's converter writes them: the Q/K row permutation
of GGUF's "llama" layout, Gemma's norm weights stored as 1 + w, llama 3's rope_freqs tensor, and
the experts of mixture models (convert_moe.py), and the families of convert_fused.py and
convert_families.py."""
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import numpy as np

from .convert_error import ConvertError
from .convert_families import olmo2_layers, read_gemma2, read_granite, read_olmo2, read_smollm3
from .convert_fused import (cohere_layers, glm4_layers, phi3_layers, read_cohere, read_cohere2, read_glm4,
                            read_mistral3, read_phi3)
from .convert_deepseek2 import deepseek2_tensors, deepseek2_transformed, read_deepseek2
from .convert_gemma4 import gemma4_tensors, read_gemma4
from .convert_hybrid import qwen35_tensors, qwen35_transformed, read_qwen3next, read_qwen35, read_qwen35moe
from .convert_lfm2 import ALIASES as LFM2_ALIASES
from .convert_lfm2 import FINAL_NORM as LFM2_FINAL_NORM
from .convert_lfm2 import LFM2MOE, lfm2_tensors, lfm2_transformed, read_lfm2, read_lfm2moe
from .convert_llama4 import llama4_expert_tensors, llama4_tensors, read_llama4
from .convert_mamba2 import (complete_nemotron_h, granite_hybrid_tensors, granite_hybrid_transformed,
                             nemotron_h_tensors, nemotron_h_transformed, nemotron_h_variant, read_granite_hybrid,
                             read_nemotron_h)
from .convert_moe import GPT_OSS, MIXTRAL, QWEN3MOE, ExpertLayout, add_expert_keys, expert_tensors, read_experts
from .convert_rope import Rope, add_rope_scaling, llama3_rope_divisors, read_rope, split_rope_params


@dataclass(frozen=True)
class ArchSpec:
    gguf_arch: str
    permute_qk: bool = False   # llama's rope rotates adjacent pairs; HF stores Q/K rows in halves
    qkv_bias: bool = False     # Qwen2 has Q/K/V biases
    qk_norm: bool = False      # per-head RMSNorm of Q and K (Qwen3, Gemma 3)
    gemma: bool = False        # Gemma 3: norms around attention and FFN, (1 + w) norms, tied head
    act: str = "silu"
    rope_scalings: tuple = ("linear", "yarn")
    multimodal: bool = False   # the text model sits under a language-model prefix
    experts: Optional[ExpertLayout] = None   # a mixture: where its router and experts are
    gpt_oss: bool = False      # O bias, attention sinks, alternating sliding-window layers, YaRN unrounded
    defaults: dict = field(default_factory=dict)   # config values transformers fills in when absent
    read_extra: Optional[Callable] = None   # (config, Hparams, path): the family's own keys (convert_fused.py)
    layer_map: Optional[Callable] = None    # (per-layer tensor map, Hparams): edits it in place
    yarn_mscale: object = False   # YaRN's mscale_all_dim is written: True (Mistral 3, mscale 1), "equal" (DeepSeek)
    tensors: Optional[Callable] = None      # (Hparams) -> every layer's tensor map where layers differ (Gemma 4)
    expert_tensors: Optional[Callable] = None   # (Hparams) -> the ExpertTensors of a layout of its own (llama 4)
    norm_plus_one: bool = False             # the final RMSNorm scales by (1 + w): stored as the sum (Qwen3.5)
    final_norm: tuple = ("model.norm.weight", "output_norm.weight")   # (HF name, GGUF name)
    aliases: dict = field(default_factory=dict)   # config key -> the name transformers reads it as (older configs)
    token_embd: str = "model.embed_tokens.weight"   # the HF name of the token embeddings
    complete: Optional[Callable] = None   # (config, path) -> config with values it leaves implicit (Nemotron-H)
    variant: Optional[Callable] = None    # (config) -> the GGUF architecture where the config decides it (Nemotron-H)


# Gemma3TextConfig's defaults: released checkpoints leave many of these out of config.json.
_GEMMA3_DEFAULTS = {
    "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "tie_word_embeddings": True,
}
_LLAMA = ArchSpec("llama", permute_qk=True, rope_scalings=("linear", "yarn", "llama3"))
_GEMMA3 = dict(qk_norm=True, gemma=True, act="gelu_pytorch_tanh", rope_scalings=("linear",),
               defaults=_GEMMA3_DEFAULTS)
_GEMMA4 = dict(qk_norm=True, act="gelu_pytorch_tanh", rope_scalings=("proportional",), read_extra=read_gemma4,
               tensors=gemma4_tensors)
_DEEPSEEK2 = ArchSpec("deepseek2", rope_scalings=("yarn",), read_extra=read_deepseek2, yarn_mscale="equal",
                      tensors=deepseek2_tensors, expert_tensors=deepseek2_transformed)
_QWEN35 = dict(qk_norm=True, tensors=qwen35_tensors, expert_tensors=qwen35_transformed, norm_plus_one=True)
# Qwen3.5-MoE configs have no intermediate_size: feed_forward_length is the shared expert's width,
# which read_qwen35moe sets.
_QWEN35MOE = dict(read_extra=read_qwen35moe, defaults={"intermediate_size": 1}, **_QWEN35)
ARCHS = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": ArchSpec("qwen2", qkv_bias=True),
    "Qwen3ForCausalLM": ArchSpec("qwen3", qk_norm=True),
    "Gemma3ForCausalLM": ArchSpec("gemma3", **_GEMMA3),
    "Gemma3ForConditionalGeneration": ArchSpec("gemma3", multimodal=True, **_GEMMA3),
    "Qwen3MoeForCausalLM": ArchSpec("qwen3moe", qk_norm=True, experts=QWEN3MOE),
    "MixtralForCausalLM": ArchSpec("llama", permute_qk=True, experts=MIXTRAL),
    "GptOssForCausalLM": ArchSpec("gpt-oss", qkv_bias=True, experts=GPT_OSS, gpt_oss=True, rope_scalings=("yarn",)),
    "Phi3ForCausalLM": ArchSpec("phi3", rope_scalings=("longrope",), read_extra=read_phi3, layer_map=phi3_layers),
    "Gemma2ForCausalLM": ArchSpec("gemma2", gemma=True, act="gelu_pytorch_tanh", rope_scalings=(),
                                  read_extra=read_gemma2),
    "Olmo2ForCausalLM": ArchSpec("olmo2", read_extra=read_olmo2, layer_map=olmo2_layers),
    "Olmo3ForCausalLM": ArchSpec("olmo2", read_extra=read_olmo2, layer_map=olmo2_layers),
    "GraniteForCausalLM": ArchSpec("granite", permute_qk=True, read_extra=read_granite),
    "SmolLM3ForCausalLM": ArchSpec("smollm3", permute_qk=True, read_extra=read_smollm3),
    "Ministral3ForCausalLM": ArchSpec("mistral3", permute_qk=True, rope_scalings=("yarn",), read_extra=read_mistral3,
                                      yarn_mscale=True),
    # Ministral 3 and Mistral Small 3.x as released (with Pixtral's vision tower, not converted).
    "Mistral3ForConditionalGeneration": ArchSpec("mistral3", permute_qk=True, multimodal=True, rope_scalings=("yarn",),
                                                 read_extra=read_mistral3, yarn_mscale=True),
    "Glm4ForCausalLM": ArchSpec("glm4", qkv_bias=True, read_extra=read_glm4, layer_map=glm4_layers),
    "CohereForCausalLM": ArchSpec("command-r", read_extra=read_cohere, layer_map=cohere_layers),
    "Gemma4ForCausalLM": ArchSpec("gemma4", **_GEMMA4),
    # Gemma 4 as released (with its vision and audio towers, not converted).
    "Gemma4ForConditionalGeneration": ArchSpec("gemma4", multimodal=True, **_GEMMA4),
    "Cohere2ForCausalLM": ArchSpec("cohere2", read_extra=read_cohere2, layer_map=cohere_layers),
    "Qwen3_5ForCausalLM": ArchSpec("qwen35", read_extra=read_qwen35, **_QWEN35),
    "Qwen3_5MoeForCausalLM": ArchSpec("qwen35moe", **_QWEN35MOE),
    # Qwen3.5 / 3.6 as released (with their vision tower, not converted).
    "Qwen3_5ForConditionalGeneration": ArchSpec("qwen35", multimodal=True, read_extra=read_qwen35, **_QWEN35),
    "Qwen3_5MoeForConditionalGeneration": ArchSpec("qwen35moe", multimodal=True, **_QWEN35MOE),
    "Qwen3NextForCausalLM": ArchSpec("qwen3next", read_extra=read_qwen3next, **_QWEN35),
    "NemotronHForCausalLM": ArchSpec("nemotron_h", read_extra=read_nemotron_h, tensors=nemotron_h_tensors,
                                     expert_tensors=nemotron_h_transformed, complete=complete_nemotron_h,
                                     variant=nemotron_h_variant,
                                     final_norm=("backbone.norm_f.weight", "output_norm.weight"),
                                     token_embd="backbone.embeddings.weight"),
    "GraniteMoeHybridForCausalLM": ArchSpec("granitehybrid", read_extra=read_granite_hybrid,
                                            tensors=granite_hybrid_tensors, expert_tensors=granite_hybrid_transformed),
    "Lfm2ForCausalLM": ArchSpec("lfm2", qk_norm=True, read_extra=read_lfm2, tensors=lfm2_tensors,
                                expert_tensors=lfm2_transformed, final_norm=LFM2_FINAL_NORM, aliases=LFM2_ALIASES),
    "Lfm2MoeForCausalLM": ArchSpec("lfm2moe", qk_norm=True, read_extra=read_lfm2moe, tensors=lfm2_tensors,
                                   expert_tensors=lfm2_transformed, final_norm=LFM2_FINAL_NORM, aliases=LFM2_ALIASES,
                                   experts=LFM2MOE),
    "DeepseekV2ForCausalLM": _DEEPSEEK2,
    "DeepseekV3ForCausalLM": _DEEPSEEK2,
    "Glm4MoeLiteForCausalLM": _DEEPSEEK2,
    "Llama4ForCausalLM": ArchSpec("llama4", rope_scalings=("llama3",), read_extra=read_llama4, tensors=llama4_tensors,
                                  expert_tensors=llama4_expert_tensors),
}

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Buffers some checkpoints carry that the forward recomputes.
_IGNORED_RE = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
# Where multimodal checkpoints keep the language model (transformers >= 4.52, then older), and
# the parts of them that are not the language model.
_MM_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")
_MM_OTHER_RE = re.compile(
    r"^(model\.)?(vision_tower|visual|multi_modal_projector|audio_tower|embed_vision|embed_audio)\.")
# The output head sits beside the language model (transformers >= 4.52) or in it (older).
_MM_HEAD_RE = re.compile(r"^(language_model\.)?lm_head\.weight$")


@dataclass
class Hparams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    rms_eps: float
    rope: Rope
    tied: bool
    rope_base_swa: Optional[float] = None
    n_swa: int = 0
    swa_pattern: object = None     # None: llama.cpp's default; int period; or a bool per layer
    final_softcap: Optional[float] = None
    attn_scale: Optional[float] = None
    experts: object = None         # convert_moe.Experts of a mixture
    keys: dict = field(default_factory=dict)   # {arch}.<name> -> float: a family's own keys
    n_rot: Optional[int] = None    # rotated dimensions of a head (partial rotary); None: the head
    write_swa: bool = False        # write attention.sliding_window even when 0 (phi3)
    orig_ctx: Optional[int] = None          # rope.scaling.original_context_length outside YaRN (phi3)
    rope_attn_factor: Optional[float] = None   # rope.scaling.attn_factor (LongRoPE)
    extra_tensors: dict = field(default_factory=dict)   # GGUF name -> f32 array computed from the config
    int_keys: dict = field(default_factory=dict)   # {arch}.<name> -> uint32: a family's own integer keys
    family: dict = field(default_factory=dict)     # a family's own values its tensor map reads
    array_keys: dict = field(default_factory=dict)   # {arch}.<name> -> list: a family's own array keys
    value_length: Optional[int] = None   # attention.value_length where it is not head_dim (DeepSeek's latent)
    n_head_kv_layer: Optional[list] = None   # KV heads of each layer (0: no attention), written for n_head_kv
    n_ff_layer: Optional[list] = None   # feed-forward width of each layer (0: none), written for n_ff
    bool_keys: dict = field(default_factory=dict)   # {arch}.<name> -> bool: a family's own flags


@dataclass
class TensorPlan:
    hf_name: str          # the checkpoint's name; None for a tensor computed from the config
    gguf_name: str
    shape: tuple          # numpy (HF) order: rows first
    permute_heads: int = 0     # > 0: apply the llama Q/K permutation with this many heads
    shift: float = 0.0         # added to every element (Gemma's 1 + w norms)
    data: Optional[np.ndarray] = None
    inputs: tuple = ()         # several checkpoint tensors made into this one by combine (experts)
    combine: Optional[Callable] = None


def _need(config, key, path):
    if config.get(key) is None:
        raise ConvertError(f"{path}: missing key '{key}'")
    return config[key]


def _int(config, key, path, default=None):
    value = config.get(key)
    if value is None:
        if default is None:
            raise ConvertError(f"{path}: missing key '{key}'")
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ConvertError(f"{path}: '{key}' must be an integer, got {value!r}")
    if value <= 0:
        raise ConvertError(f"{path}: '{key}' must be positive, got {value!r}")
    return int(value)


def arch_of(config, path):
    """(HF architecture name, spec, the config the text model is described by)."""
    archs = config.get("architectures") or []
    if not archs:
        raise ConvertError(f"{path}: no 'architectures' entry")
    name = archs[0]
    if name not in ARCHS:
        raise ConvertError(f"unsupported architecture {name} (supported: {', '.join(ARCHS)})")
    spec = ARCHS[name]
    text = config
    if spec.multimodal:
        if not isinstance(config.get("text_config"), dict):
            raise ConvertError(f"{path}: {name} without a 'text_config' object")
        text = config["text_config"]
    renamed = {new: text[old] for old, new in spec.aliases.items() if old in text}
    text = {**spec.defaults, **renamed, **text}
    if spec.complete:
        text = spec.complete(text, path)
    if spec.variant:
        spec = replace(spec, gguf_arch=spec.variant(text))
    return name, spec, text


def _gemma3_layer_types(config, n_layer, path):
    types = config.get("layer_types")
    if types is None:
        period = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
        if not isinstance(period, int) or period <= 0:
            raise ConvertError(f"{path}: 'sliding_window_pattern' must be a positive integer, got {period!r}")
        return [(i + 1) % period != 0 for i in range(n_layer)]
    if len(types) != n_layer:
        raise ConvertError(f"{path}: 'layer_types' has {len(types)} entries, expected num_hidden_layers={n_layer}")
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layer_types'")
    return [t == "sliding_attention" for t in types]


def _swa_pattern(sliding):
    """None when llama.cpp's gemma3 default (five local layers, then one global) holds; else the
    period p (layer i local iff i % p < p - 1) when there is one, else the per-layer list."""
    n = len(sliding)
    if sliding == [i % 6 < 5 for i in range(n)]:
        return None
    for period in range(1, n + 2):
        if sliding == [i % period < period - 1 for i in range(n)]:
            return period
    return list(sliding)


def _read_gemma3(config, hp, path):
    if config.get("attn_logit_softcapping") is not None:
        raise ConvertError(f"{path}: attn_logit_softcapping is not supported for gemma3")
    if config.get("use_bidirectional_attention"):
        raise ConvertError(f"{path}: use_bidirectional_attention=true is not supported for gemma3")
    if not hp.tied:
        raise ConvertError(f"{path}: tie_word_embeddings=false is not supported for gemma3 (the head is token_embd)")
    sliding = _gemma3_layer_types(config, hp.n_layer, path)
    _, local = split_rope_params(config)
    if any(sliding):
        hp.n_swa = _int(config, "sliding_window", path)
        if local is None:
            raise ConvertError(f"{path}: no rope parameters for the sliding-window layers")
        hp.rope_base_swa = read_rope(local, 10_000.0, path, allowed=(),
                                     what="rope scaling of the sliding-window layers").base
    hp.swa_pattern = _swa_pattern(sliding)
    if config.get("final_logit_softcapping") is not None:
        hp.final_softcap = float(config["final_logit_softcapping"])
    scalar = _need(config, "query_pre_attn_scalar", path)
    if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or scalar <= 0:
        raise ConvertError(f"{path}: 'query_pre_attn_scalar' must be a positive number, got {scalar!r}")
    # llama.cpp's gemma3 scales queries by 1/sqrt(head_dim) (1/sqrt(hidden/heads) for the 62-layer
    # 27B); any other HF scalar needs the explicit key.
    if scalar != hp.head_dim:
        hp.attn_scale = scalar ** -0.5


def read_hparams(config, spec, path):
    n_head = _int(config, "num_attention_heads", path)
    n_embd = _int(config, "hidden_size", path)
    act = config.get("hidden_activation") or config.get("hidden_act") or "silu"
    if act != spec.act:
        raise ConvertError(f"{path}: unsupported hidden activation '{act}' for {spec.gguf_arch} (expected {spec.act})")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag) and not (flag == "attention_bias" and spec.qkv_bias):
            raise ConvertError(f"{path}: unsupported {flag}=true for {spec.gguf_arch}")
    if not (spec.gemma or spec.gpt_oss or spec.read_extra) and (config.get("use_sliding_window")
                                             or "sliding_attention" in (config.get("layer_types") or [])):
        raise ConvertError(f"{path}: sliding-window attention is not supported for {spec.gguf_arch}")
    rope_params, _ = split_rope_params(config)
    hp = Hparams(
        n_vocab=_int(config, "vocab_size", path),
        n_embd=n_embd,
        n_layer=_int(config, "num_hidden_layers", path),
        n_ff=_int(config, "intermediate_size", path),
        n_head=n_head,
        n_head_kv=_int(config, "num_key_value_heads", path, n_head),
        head_dim=_int(config, "head_dim", path, n_embd // n_head),
        n_ctx=_int(config, "max_position_embeddings", path, 2048),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope=read_rope(rope_params, 10_000.0, path, allowed=spec.rope_scalings, unrounded_yarn=spec.gpt_oss,
                       yarn_mscale=spec.yarn_mscale),
        tied=bool(config.get("tie_word_embeddings", False)),
    )
    if n_head % hp.n_head_kv:
        raise ConvertError(f"{path}: num_attention_heads={n_head} is not a multiple of "
                           f"num_key_value_heads={hp.n_head_kv}")
    if hp.head_dim % 2:
        raise ConvertError(f"{path}: head_dim={hp.head_dim} must be even for rope")
    if spec.read_extra:
        spec.read_extra(config, hp, path)
    elif spec.gemma:
        _read_gemma3(config, hp, path)
    if spec.experts:
        hp.experts = read_experts(config, spec.experts, hp.n_layer, path)
    if spec.gpt_oss:
        hp.n_swa = _int(config, "sliding_window", path)
        if hp.rope.scaling != "yarn":
            raise ConvertError(f"{path}: gpt-oss needs YaRN rope scaling (rope_type 'yarn')")
    return hp


def add_hparams(writer, spec, hp):
    writer.add_context_length(hp.n_ctx)
    writer.add_embedding_length(hp.n_embd)
    writer.add_block_count(hp.n_layer)
    writer.add_feed_forward_length(hp.n_ff_layer or hp.n_ff)
    writer.add_head_count(hp.n_head)
    writer.add_head_count_kv(hp.n_head_kv_layer or hp.n_head_kv)
    writer.add_layer_norm_rms_eps(hp.rms_eps)
    writer.add_rope_freq_base(hp.rope.base)
    writer.add_rope_dimension_count(hp.n_rot or hp.head_dim)
    writer.add_vocab_size(hp.n_vocab)
    # llama.cpp's qwen3/gemma3 converters always write the head size; llama/qwen2 only when it
    # is not hidden_size / num_attention_heads.
    if spec.qk_norm or spec.gpt_oss or hp.head_dim * hp.n_head != hp.n_embd:
        writer.add_key_length(hp.head_dim)
        writer.add_value_length(hp.value_length or hp.head_dim)
    add_rope_scaling(writer, hp.rope)
    if hp.experts:
        add_expert_keys(writer, spec, hp.experts)
    if hp.n_swa or hp.write_swa:
        writer.add_sliding_window(hp.n_swa)
    if hp.orig_ctx is not None:
        writer.add_rope_scaling_orig_ctx_len(hp.orig_ctx)
    if hp.rope_attn_factor is not None:
        writer.add_rope_scaling_attn_factors(hp.rope_attn_factor)
    if hp.rope_base_swa is not None:
        writer.add_rope_freq_base_swa(hp.rope_base_swa)
    for value, add in ((hp.swa_pattern, writer.add_sliding_window_pattern),
                       (hp.final_softcap, writer.add_final_logit_softcapping),
                       (hp.attn_scale, writer.add_attention_scale)):
        if value is not None:
            add(value)
    for name, value in hp.keys.items():
        writer.add_float32(f"{spec.gguf_arch}.{name}", value)
    for name, value in hp.int_keys.items():
        writer.add_uint32(f"{spec.gguf_arch}.{name}", value)
    for name, value in hp.bool_keys.items():
        writer.add_bool(f"{spec.gguf_arch}.{name}", value)
    for name, value in hp.array_keys.items():
        writer.add_array(f"{spec.gguf_arch}.{name}", value)


def _layer_tensors(spec, hp):
    """HF per-layer suffix -> (GGUF suffix, numpy shape, heads to permute with)."""
    q, kv, E = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_embd
    out = {
        "input_layernorm.weight": ("attn_norm.weight", (E,), 0),
        "self_attn.q_proj.weight": ("attn_q.weight", (q, E), hp.n_head if spec.permute_qk else 0),
        "self_attn.k_proj.weight": ("attn_k.weight", (kv, E), hp.n_head_kv if spec.permute_qk else 0),
        "self_attn.v_proj.weight": ("attn_v.weight", (kv, E), 0),
        "self_attn.o_proj.weight": ("attn_output.weight", (E, q), 0),
    }
    if not spec.experts:
        out["mlp.gate_proj.weight"] = ("ffn_gate.weight", (hp.n_ff, E), 0)
        out["mlp.up_proj.weight"] = ("ffn_up.weight", (hp.n_ff, E), 0)
        out["mlp.down_proj.weight"] = ("ffn_down.weight", (E, hp.n_ff), 0)
    if spec.qkv_bias:
        out["self_attn.q_proj.bias"] = ("attn_q.bias", (q,), 0)
        out["self_attn.k_proj.bias"] = ("attn_k.bias", (kv,), 0)
        out["self_attn.v_proj.bias"] = ("attn_v.bias", (kv,), 0)
    if spec.gpt_oss:
        out["self_attn.o_proj.bias"] = ("attn_output.bias", (E,), 0)
        out["self_attn.sinks"] = ("attn_sinks.weight", (hp.n_head,), 0)
    if spec.qk_norm:
        out["self_attn.q_norm.weight"] = ("attn_q_norm.weight", (hp.head_dim,), 0)
        out["self_attn.k_norm.weight"] = ("attn_k_norm.weight", (hp.head_dim,), 0)
    if spec.gemma:
        # Gemma normalises each sublayer's output too: its "post_attention_layernorm" is that
        # output norm, and the FFN's input norm is "pre_feedforward_layernorm".
        out["post_attention_layernorm.weight"] = ("post_attention_norm.weight", (E,), 0)
        out["pre_feedforward_layernorm.weight"] = ("ffn_norm.weight", (E,), 0)
        out["post_feedforward_layernorm.weight"] = ("post_ffw_norm.weight", (E,), 0)
    elif spec.gpt_oss:
        # llama.cpp names gpt-oss's norm before the experts after HF's name for it.
        out["post_attention_layernorm.weight"] = ("post_attention_norm.weight", (E,), 0)
    else:
        out["post_attention_layernorm.weight"] = ("ffn_norm.weight", (E,), 0)
    if spec.layer_map:
        spec.layer_map(out, hp)
    return out


def _expected(spec, hp):
    """Canonical HF name -> (GGUF name, numpy shape, heads to permute with) for every tensor the
    model needs, in GGUF order (globals, then by layer)."""
    out = {
        spec.token_embd: ("token_embd.weight", (hp.n_vocab, hp.n_embd), 0),
        spec.final_norm[0]: (spec.final_norm[1], (hp.n_embd,), 0),
    }
    if not hp.tied:
        out["lm_head.weight"] = ("output.weight", (hp.n_vocab, hp.n_embd), 0)
    if spec.tensors:
        out.update(spec.tensors(hp))
        return out
    per_layer = _layer_tensors(spec, hp)
    for i in range(hp.n_layer):
        for suffix, (gguf_suffix, shape, heads) in per_layer.items():
            out[f"model.layers.{i}.{suffix}"] = (f"blk.{i}.{gguf_suffix}", shape, heads)
    return out


def _canonical_names(spec, present):
    """Checkpoint name -> the name a text-only checkpoint would use (None: not part of the text
    model, skipped)."""
    if not spec.multimodal:
        return {n: n for n in present}
    prefix = next((p for p in _MM_TEXT_PREFIXES if any(n.startswith(p) for n in present)), None)
    if prefix is None:
        raise ConvertError(f"no language-model tensors (expected names starting with "
                           f"{' or '.join(_MM_TEXT_PREFIXES)})")
    out = {}
    for n in present:
        if n.startswith(prefix):
            out[n] = "model." + n[len(prefix):]
        elif _MM_HEAD_RE.search(n):
            out[n] = "lm_head.weight"   # tied models (Gemma 3) skip it as a text-only checkpoint's copy
        elif _MM_OTHER_RE.search(n):
            out[n] = None
        else:
            out[n] = n
    return out


def _expert_tensors(spec, hp):
    if spec.expert_tensors:
        return spec.expert_tensors(hp)
    if not spec.experts:
        return []
    return [x for i in range(hp.n_layer) for x in expert_tensors(spec.experts, hp, hp.experts, i)]


def _layer_of(gguf_name):
    m = re.match(r"blk\.(\d+)\.", gguf_name)
    return int(m.group(1)) if m else -1


def plan_tensors(spec, hp, checkpoint):
    """Checks the checkpoint holds exactly the tensors the architecture needs, with the right
    shapes, before anything is written. Returns them in GGUF order (llama 3's computed
    rope_freqs first, as llama.cpp writes it; then globals, then by layer)."""
    expected = _expected(spec, hp)
    experts = _expert_tensors(spec, hp)
    wanted = set(expected) | {n for x in experts for n, _ in x.inputs}
    canonical = _canonical_names(spec, checkpoint.names())
    stored = {}
    for name in sorted(canonical):
        c = canonical[name]
        if c is None or _IGNORED_RE.search(name):
            continue
        if c in wanted:
            stored[c] = name
            continue
        if hp.tied and c == "lm_head.weight":
            continue   # some tied checkpoints store the shared matrix twice
        m = _LAYER_RE.match(c)
        if m and int(m.group(1)) >= hp.n_layer:
            raise ConvertError(f"tensor {name}: layer {m.group(1)} beyond num_hidden_layers={hp.n_layer}")
        raise ConvertError(f"unexpected tensor {name} (not part of {spec.gguf_arch})")

    def stored_name(hf_name, shape):
        if hf_name not in stored:
            prefix = f" (under {_MM_TEXT_PREFIXES[0]} or {_MM_TEXT_PREFIXES[1]})" if spec.multimodal else ""
            raise ConvertError(f"missing tensor {hf_name}{prefix}")
        name = stored[hf_name]
        got = tuple(checkpoint.shape(name))
        if got != shape:
            raise ConvertError(f"tensor {name} has shape {list(got)}, expected {list(shape)}")
        return name

    plans = [TensorPlan(None, name, data.shape, data=data) for name, data in hp.extra_tensors.items()]
    if hp.rope.scaling == "llama3":
        divisors = llama3_rope_divisors(hp.rope, hp.head_dim)
        plans.append(TensorPlan(None, "rope_freqs.weight", divisors.shape, data=divisors))
    for hf_name, (gguf_name, shape, heads) in expected.items():
        name = stored_name(hf_name, shape)
        # Gemma's RMSNorm scales by (1 + w); llama.cpp stores the sum so the norm is a plain one.
        plus_one = spec.gemma or (spec.norm_plus_one and hf_name == "model.norm.weight")
        shift = 1.0 if plus_one and hf_name.endswith("norm.weight") else 0.0
        plans.append(TensorPlan(name, gguf_name, shape, heads, shift))
    for x in experts:
        inputs = tuple(stored_name(n, shape) for n, shape in x.inputs)
        plans.append(TensorPlan(None, x.gguf_name, x.shape, inputs=inputs, combine=x.combine))
    # Each layer's experts after its other tensors (a stable sort keeps the rest in order).
    plans.sort(key=lambda p: _layer_of(p.gguf_name))
    return plans


def permute_qk(w, n_heads):
    """HF keeps each head's rotary pairs as (first half, second half) of its rows; GGUF's llama
    layout interleaves them (row 2i, 2i+1 form a pair). Works for weights [rows, cols] and biases."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def load_tensor(checkpoint, plan):
    if plan.data is not None:
        return plan.data
    if plan.combine is not None:
        return plan.combine([checkpoint.load_f32(n) for n in plan.inputs])
    data = checkpoint.load_f32(plan.hf_name)
    if plan.permute_heads:
        data = np.ascontiguousarray(permute_qk(data, plan.permute_heads))
    if plan.shift:
        data += np.float32(plan.shift)
    return data
