"""Architectures ember-convert knows: HF config.json -> GGUF hyperparameter keys, and HF tensor
names/shapes -> GGUF tensor names, with the Q/K row permutation GGUF's "llama" layout expects."""
import re
from dataclasses import dataclass

import numpy as np

from .convert_error import ConvertError


@dataclass(frozen=True)
class ArchSpec:
    gguf_arch: str
    permute_qk: bool     # llama's rope rotates adjacent pairs; HF stores Q/K rows in halves
    qkv_bias: bool       # Qwen2 has Q/K/V biases


ARCHS = {
    "LlamaForCausalLM": ArchSpec("llama", permute_qk=True, qkv_bias=False),
    "MistralForCausalLM": ArchSpec("llama", permute_qk=True, qkv_bias=False),
    "Qwen2ForCausalLM": ArchSpec("qwen2", permute_qk=False, qkv_bias=True),
}

# Per-layer HF suffix -> GGUF suffix.
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Buffers some checkpoints carry that the forward recomputes.
_IGNORED_RE = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


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
    rope_base: float
    tied: bool


@dataclass
class TensorPlan:
    hf_name: str
    gguf_name: str
    shape: tuple          # numpy (HF) order: rows first
    permute_heads: int    # > 0: apply the llama Q/K permutation with this many heads


def _need(config, key, path):
    if key not in config:
        raise ConvertError(f"{path}: missing key '{key}'")
    return config[key]


def arch_of(config, path):
    archs = config.get("architectures") or []
    if not archs:
        raise ConvertError(f"{path}: no 'architectures' entry")
    name = archs[0]
    if name not in ARCHS:
        raise ConvertError(f"unsupported architecture {name} (supported: {', '.join(ARCHS)})")
    return name, ARCHS[name]


def read_hparams(config, spec, path):
    n_head = int(_need(config, "num_attention_heads", path))
    n_embd = int(_need(config, "hidden_size", path))
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        # ember's forward has no scaled rope: refusing beats a file that runs with wrong positions.
        raise ConvertError(f"{path}: unsupported rope scaling '{rope_type}'")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"{path}: unsupported hidden_act '{act}' (expected silu)")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag) and not (flag == "attention_bias" and spec.qkv_bias):
            raise ConvertError(f"{path}: unsupported {flag}=true for {spec.gguf_arch}")
    return Hparams(
        n_vocab=int(_need(config, "vocab_size", path)),
        n_embd=n_embd,
        n_layer=int(_need(config, "num_hidden_layers", path)),
        n_ff=int(_need(config, "intermediate_size", path)),
        n_head=n_head,
        n_head_kv=int(config.get("num_key_value_heads") or n_head),
        head_dim=int(config.get("head_dim") or n_embd // n_head),
        n_ctx=int(config.get("max_position_embeddings", 2048)),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_base=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        tied=bool(config.get("tie_word_embeddings", False)),
    )


def add_hparams(writer, hp):
    writer.add_context_length(hp.n_ctx)
    writer.add_embedding_length(hp.n_embd)
    writer.add_block_count(hp.n_layer)
    writer.add_feed_forward_length(hp.n_ff)
    writer.add_head_count(hp.n_head)
    writer.add_head_count_kv(hp.n_head_kv)
    writer.add_layer_norm_rms_eps(hp.rms_eps)
    writer.add_rope_freq_base(hp.rope_base)
    writer.add_rope_dimension_count(hp.head_dim)
    writer.add_vocab_size(hp.n_vocab)
    if hp.head_dim * hp.n_head != hp.n_embd:
        writer.add_key_length(hp.head_dim)
        writer.add_value_length(hp.head_dim)


def _expected_shapes(spec, hp):
    """HF name -> (GGUF name, numpy shape, heads to permute with) for every tensor the model needs."""
    q, kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    out = {
        "model.embed_tokens.weight": ("token_embd.weight", (hp.n_vocab, hp.n_embd), 0),
        "model.norm.weight": ("output_norm.weight", (hp.n_embd,), 0),
    }
    if not hp.tied:
        out["lm_head.weight"] = ("output.weight", (hp.n_vocab, hp.n_embd), 0)
    per_layer = {
        "input_layernorm.weight": ((hp.n_embd,), 0),
        "self_attn.q_proj.weight": ((q, hp.n_embd), hp.n_head if spec.permute_qk else 0),
        "self_attn.k_proj.weight": ((kv, hp.n_embd), hp.n_head_kv if spec.permute_qk else 0),
        "self_attn.v_proj.weight": ((kv, hp.n_embd), 0),
        "self_attn.o_proj.weight": ((hp.n_embd, q), 0),
        "post_attention_layernorm.weight": ((hp.n_embd,), 0),
        "mlp.gate_proj.weight": ((hp.n_ff, hp.n_embd), 0),
        "mlp.up_proj.weight": ((hp.n_ff, hp.n_embd), 0),
        "mlp.down_proj.weight": ((hp.n_embd, hp.n_ff), 0),
    }
    if spec.qkv_bias:
        per_layer["self_attn.q_proj.bias"] = ((q,), 0)
        per_layer["self_attn.k_proj.bias"] = ((kv,), 0)
        per_layer["self_attn.v_proj.bias"] = ((kv,), 0)
    for i in range(hp.n_layer):
        for suffix, (shape, heads) in per_layer.items():
            out[f"model.layers.{i}.{suffix}"] = (f"blk.{i}.{_LAYER_MAP[suffix]}", shape, heads)
    return out


def plan_tensors(spec, hp, checkpoint):
    """Checks the checkpoint holds exactly the tensors the architecture needs, with the right
    shapes, before anything is written. Returns them in GGUF order (globals, then by layer)."""
    expected = _expected_shapes(spec, hp)
    present = set(checkpoint.names())
    for name in sorted(present):
        if name in expected or _IGNORED_RE.search(name):
            continue
        if hp.tied and name == "lm_head.weight":
            continue   # some tied checkpoints store the shared matrix twice
        m = _LAYER_RE.match(name)
        if m and int(m.group(1)) >= hp.n_layer:
            raise ConvertError(f"tensor {name}: layer {m.group(1)} beyond num_hidden_layers={hp.n_layer}")
        raise ConvertError(f"unexpected tensor {name} (not part of {spec.gguf_arch})")
    plans = []
    for hf_name, (gguf_name, shape, heads) in expected.items():
        if hf_name not in present:
            raise ConvertError(f"missing tensor {hf_name}")
        got = tuple(checkpoint.shape(hf_name))
        if got != shape:
            raise ConvertError(f"tensor {hf_name} has shape {list(got)}, expected {list(shape)}")
        plans.append(TensorPlan(hf_name, gguf_name, shape, heads))
    return plans


def permute_qk(w, n_heads):
    """HF keeps each head's rotary pairs as (first half, second half) of its rows; GGUF's llama
    layout interleaves them (row 2i, 2i+1 form a pair). Works for weights [rows, cols] and biases."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def load_tensor(checkpoint, plan):
    data = checkpoint.load_f32(plan.hf_name)
    if plan.permute_heads:
        data = np.ascontiguousarray(permute_qk(data, plan.permute_heads))
    return data
