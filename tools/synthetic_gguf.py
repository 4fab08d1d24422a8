#!/usr/bin/env python3
"""Full-size GGUF models with random weights, for speed and memory work without downloads.

The shapes, tensor names, metadata and tokenizer are those of a real model of the family, so a
GGUF runtime does the work the real model would; the text it writes is noise. Tensors are F16
(norms F32); `ember-quantize` turns the file into Q4_0, Q8_0, Q4_K_M, ... `--type Q8_0` writes the
matrices as Q8_0 instead: half the bytes, for shapes whose F16 file would not fit a disk beside its
quantized copy (Qwen3-30B-A3B: 61 GB in F16); llama-quantize --allow-requantize takes it from there.

    synthetic_gguf.py --shape llama2-7b --vocab vocab.gguf -o l7b-f16.gguf
    synthetic_gguf.py --vocab-only --vocab SmolLM2-135M-Instruct.Q4_1.gguf -o vocab.gguf
    synthetic_gguf.py --list

--vocab is any GGUF with tokenizer.* metadata (tests/fuzz/vocab/smollm2.gguf.gz unpacked is one);
its vocabulary sets the embedding and output sizes. --vocab-only writes just those keys: a file
small enough to carry where the model itself cannot go.
"""
import argparse
import dataclasses
import functools
import sys
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, RopeScalingType
from gguf.quants import quantize


@dataclasses.dataclass(frozen=True)
class Shape:
    arch: str            # general.architecture
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn: int             # feed_forward_length (dense layers)
    head_dim: int = 0    # 0: dim / n_heads; else written as attention.key_length / value_length
    n_experts: int = 0   # MoE: experts per layer, how many a token takes, each one's ffn width
    n_experts_used: int = 0
    expert_ffn: int = 0
    attn_layers: Tuple[int, ...] = ()   # hybrid: the layers that attend; the others are recurrent
    conv_cache: int = 0  # hybrid short-conv layers: the convolution's length (LFM2's l_cache)
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    window: int = 0      # gpt-oss: sliding window of its even layers (and its biases, sinks, YaRN)
    yarn: Tuple[float, int] = ()   # YaRN (factor, original context)
    # Gemma 4: the global layers' head size and KV heads (their values the keys' projection); one
    # global layer after each five sliding ones; the logits' soft-cap.
    global_head_dim: int = 0
    global_kv_heads: int = 0
    softcap: float = 0.0
    # Llama 4: a mixture (with a shared expert) every moe_every-th layer, dense layers between; its
    # chunk is `window`.
    moe_every: int = 0

    def moe(self, i: int) -> bool:
        return bool(self.n_experts) and (not self.moe_every or (i + 1) % self.moe_every == 0)

    def sliding(self, i: int) -> bool:
        return self.arch == "gemma4" and i % 6 < 5

    def layer_head(self, i: int) -> int:
        return self.global_head_dim if self.arch == "gemma4" and not self.sliding(i) else self.head

    def layer_kv_heads(self, i: int) -> int:
        return self.global_kv_heads if self.arch == "gemma4" and not self.sliding(i) else self.n_kv_heads

    @property
    def head(self) -> int:
        return self.head_dim or self.dim // self.n_heads


# The real models' hyperparameters; the tiny rows are the same families at test size.
SHAPES: Dict[str, Shape] = {
    "llama-tiny": Shape("llama", 256, 4, 8, 4, 768),
    "smol-135m": Shape("llama", 576, 30, 9, 3, 1536),
    "llama-1b": Shape("llama", 2048, 16, 32, 8, 8192, rope_base=500000.0),
    "llama2-7b": Shape("llama", 4096, 32, 32, 32, 11008),
    "llama3-8b": Shape("llama", 4096, 32, 32, 8, 14336, rope_base=500000.0),
    "llama2-13b": Shape("llama", 5120, 40, 40, 40, 13824),
    "qwen3-tiny": Shape("qwen3", 256, 4, 8, 4, 768, head_dim=64, rope_base=1e6, rms_eps=1e-6),
    "qwen3-0.6b": Shape("qwen3", 1024, 28, 16, 8, 3072, head_dim=128, rope_base=1e6, rms_eps=1e-6),
    "qwen3-8b": Shape("qwen3", 4096, 36, 32, 8, 12288, head_dim=128, rope_base=1e6, rms_eps=1e-6),
    "qwen3moe-tiny": Shape("qwen3moe", 256, 4, 8, 4, 768, head_dim=64, n_experts=8, n_experts_used=2,
                           expert_ffn=128, rope_base=1e6, rms_eps=1e-6),
    # Qwen3-30B-A3B's layout at a size two CPU threads decode: the CPU's speed checks against llama-bench.
    "qwen3moe-2b": Shape("qwen3moe", 1024, 16, 16, 4, 3072, head_dim=128, n_experts=64, n_experts_used=8,
                         expert_ffn=512, rope_base=1e6, rms_eps=1e-6),
    "qwen3-30b-a3b": Shape("qwen3moe", 2048, 48, 32, 4, 6144, head_dim=128, n_experts=128, n_experts_used=8,
                           expert_ffn=768, rope_base=1e6, rms_eps=1e-6),
    "gpt-oss-tiny": Shape("gpt-oss", 256, 4, 8, 2, 128, head_dim=64, n_experts=8, n_experts_used=2, expert_ffn=128,
                          rope_base=150000.0, window=16, yarn=(32.0, 4096)),
    "gpt-oss-20b": Shape("gpt-oss", 2880, 24, 64, 8, 2880, head_dim=64, n_experts=32, n_experts_used=4,
                         expert_ffn=2880, rope_base=150000.0, window=128, yarn=(32.0, 4096)),
    "gpt-oss-120b": Shape("gpt-oss", 2880, 36, 64, 8, 2880, head_dim=64, n_experts=128, n_experts_used=4,
                          expert_ffn=2880, rope_base=150000.0, window=128, yarn=(32.0, 4096)),
    # Phi-3 / Phi-4: Q, K, V in one attn_qkv and gate, up in one ffn_up (Phi-4 14B: no LongRoPE, no window).
    "phi3-tiny": Shape("phi3", 256, 4, 8, 4, 768),
    "phi3.5-mini": Shape("phi3", 3072, 32, 32, 32, 8192),
    "phi4-14b": Shape("phi3", 5120, 40, 40, 10, 17920, rope_base=250000.0),
    # Gemma 2: norms after attention and the feed-forward too, a window on every other layer, tied head.
    "gemma2-tiny": Shape("gemma2", 256, 4, 8, 4, 768, head_dim=32, window=16, rms_eps=1e-6),
    "gemma2-9b": Shape("gemma2", 3584, 42, 16, 8, 14336, head_dim=256, window=4096, rms_eps=1e-6),
    # Gemma 4 (dense): q/k norms, global layers with heads of their own, layer scales, tied head.
    "gemma4-tiny": Shape("gemma4", 256, 6, 8, 4, 768, head_dim=32, global_head_dim=64, global_kv_heads=2, window=16,
                         rope_base=1e6, rms_eps=1e-6, softcap=30.0),
    "gemma4-31b": Shape("gemma4", 5376, 60, 32, 16, 21504, head_dim=256, global_head_dim=512, global_kv_heads=4,
                        window=1024, rope_base=1e6, rms_eps=1e-6, softcap=30.0),
    # Llama 4: chunked layers with a NoPE layer every fourth, mixture layers (top 1 of sigmoid scores, a
    # shared expert) every moe_every-th layer, dense ones between (ffn: the dense layers' width).
    "llama4-tiny": Shape("llama4", 256, 4, 8, 4, 768, head_dim=32, n_experts=4, n_experts_used=1, expert_ffn=256,
                         moe_every=2, window=16, rope_base=500000.0),
    "llama4-scout": Shape("llama4", 5120, 48, 40, 8, 16384, head_dim=128, n_experts=16, n_experts_used=1,
                          expert_ffn=8192, moe_every=1, window=8192, rope_base=500000.0),
    "llama4-maverick": Shape("llama4", 5120, 48, 40, 8, 16384, head_dim=128, n_experts=128, n_experts_used=1,
                             expert_ffn=8192, moe_every=2, window=8192, rope_base=500000.0),
    "lfm2-tiny": Shape("lfm2", 256, 4, 8, 4, 768, attn_layers=(1, 3), conv_cache=3, rope_base=1e6),
    "lfm2-1.2b": Shape("lfm2", 2048, 16, 32, 8, 8192, attn_layers=(2, 5, 8, 10, 12, 14), conv_cache=3,
                       rope_base=1e6),
}

# (name, numpy shape, is a norm): norms are F32 and drawn near 1 (gpt-oss's biases and sinks as
# well: F32 as llama.cpp keeps them), everything else F16 near 0.
Tensor = Tuple[str, Tuple[int, ...], bool]


def _gemma4_attention(p: str, s: Shape, i: int) -> List[Tensor]:
    d, kv = s.layer_head(i), s.layer_kv_heads(i) * s.layer_head(i)
    out = [(p + "attn_q.weight", (s.n_heads * d, s.dim), False), (p + "attn_k.weight", (kv, s.dim), False)]
    if s.sliding(i):
        out.append((p + "attn_v.weight", (kv, s.dim), False))
    return out + [(p + "attn_output.weight", (s.dim, s.n_heads * d), False),
                  (p + "attn_q_norm.weight", (d,), True), (p + "attn_k_norm.weight", (d,), True)]


def _attention(p: str, s: Shape, qk_norm: bool) -> List[Tensor]:
    if s.arch == "phi3":
        return [(p + "attn_qkv.weight", ((s.n_heads + 2 * s.n_kv_heads) * s.head, s.dim), False),
                (p + "attn_output.weight", (s.dim, s.n_heads * s.head), False)]
    out = [(p + "attn_q.weight", (s.n_heads * s.head, s.dim), False),
           (p + "attn_k.weight", (s.n_kv_heads * s.head, s.dim), False),
           (p + "attn_v.weight", (s.n_kv_heads * s.head, s.dim), False),
           (p + "attn_output.weight", (s.dim, s.n_heads * s.head), False)]
    if qk_norm:
        out += [(p + "attn_q_norm.weight", (s.head,), True), (p + "attn_k_norm.weight", (s.head,), True)]
    if s.arch == "gpt-oss":
        out += [(p + "attn_q.bias", (s.n_heads * s.head,), True), (p + "attn_k.bias", (s.n_kv_heads * s.head,), True),
                (p + "attn_v.bias", (s.n_kv_heads * s.head,), True), (p + "attn_output.bias", (s.dim,), True),
                (p + "attn_sinks.weight", (s.n_heads,), True)]
    return out


def _dense_ffn(p: str, s: Shape) -> List[Tensor]:
    if s.arch == "phi3":
        return [(p + "ffn_norm.weight", (s.dim,), True), (p + "ffn_up.weight", (2 * s.ffn, s.dim), False),
                (p + "ffn_down.weight", (s.dim, s.ffn), False)]
    return [(p + "ffn_norm.weight", (s.dim,), True),
            (p + "ffn_gate.weight", (s.ffn, s.dim), False),
            (p + "ffn_up.weight", (s.ffn, s.dim), False),
            (p + "ffn_down.weight", (s.dim, s.ffn), False)]


def _moe_ffn(p: str, s: Shape) -> List[Tensor]:
    # Experts stacked in one tensor each: ggml's [n_embd, n_ff, n_expert] is numpy's reverse.
    # gpt-oss names the norm before them post_attention_norm and has biases on all of them.
    oss = s.arch == "gpt-oss"
    out = [(p + ("post_attention_norm.weight" if oss else "ffn_norm.weight"), (s.dim,), True),
           (p + "ffn_gate_inp.weight", (s.n_experts, s.dim), False),
           (p + "ffn_gate_exps.weight", (s.n_experts, s.expert_ffn, s.dim), False),
           (p + "ffn_up_exps.weight", (s.n_experts, s.expert_ffn, s.dim), False),
           (p + "ffn_down_exps.weight", (s.n_experts, s.dim, s.expert_ffn), False)]
    if oss:
        out += [(p + "ffn_gate_inp.bias", (s.n_experts,), True),
                (p + "ffn_gate_exps.bias", (s.n_experts, s.expert_ffn), True),
                (p + "ffn_up_exps.bias", (s.n_experts, s.expert_ffn), True),
                (p + "ffn_down_exps.bias", (s.n_experts, s.dim), True)]
    return out


def _short_conv(p: str, s: Shape) -> List[Tensor]:
    # LFM2's gated short convolution: in_proj gives B, C and x; a depthwise conv over conv_cache steps.
    return [(p + "shortconv.in_proj.weight", (3 * s.dim, s.dim), False),
            (p + "shortconv.conv.weight", (s.dim, s.conv_cache), False),
            (p + "shortconv.out_proj.weight", (s.dim, s.dim), False)]


def tensors(s: Shape, n_vocab: int) -> Iterator[Tensor]:
    """Every tensor of the model in file order."""
    yield "token_embd.weight", (n_vocab, s.dim), False
    if s.arch == "gemma4":   # the global layers' rope divisors (drawn near 1 here)
        yield "rope_freqs.weight", (s.global_head_dim // 2,), True
    for i in range(s.n_layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (s.dim,), True
        if s.arch == "lfm2":
            yield from (_attention(p, s, True) if i in s.attn_layers else _short_conv(p, s))
        elif s.arch == "gemma4":
            yield from _gemma4_attention(p, s, i)
        else:
            yield from _attention(p, s, s.arch in ("qwen3", "qwen3moe"))
        if s.arch in ("gemma2", "gemma4"):
            yield p + "post_attention_norm.weight", (s.dim,), True
        yield from (_moe_ffn(p, s) if s.moe(i) else _dense_ffn(p, s))
        if s.arch == "llama4" and s.moe(i):
            yield from [(p + "ffn_gate_shexp.weight", (s.expert_ffn, s.dim), False),
                        (p + "ffn_up_shexp.weight", (s.expert_ffn, s.dim), False),
                        (p + "ffn_down_shexp.weight", (s.dim, s.expert_ffn), False)]
        if s.arch in ("gemma2", "gemma4"):
            yield p + "post_ffw_norm.weight", (s.dim,), True
        if s.arch == "gemma4":
            yield p + "layer_output_scale.weight", (1,), True
    # LFM2 names its final norm token_embd_norm and ties the output to the embedding.
    if s.arch == "lfm2":
        yield "token_embd_norm.weight", (s.dim,), True
    else:
        yield "output_norm.weight", (s.dim,), True
        if s.arch not in ("gemma2", "gemma4"):   # Gemma's head is token_embd
            yield "output.weight", (n_vocab, s.dim), False


def _field_value(field):
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data], sub
        return [field.parts[i].tolist()[0] for i in field.data], sub
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8"), None
    return field.parts[field.data[0]].tolist()[0], None


@functools.lru_cache(maxsize=4)
def _tokenizer_keys(path: str) -> Tuple[Tuple[str, object, GGUFValueType, Optional[GGUFValueType]], ...]:
    # Cached: gguf's reader takes seconds over a 49k-token vocabulary, and callers write several models.
    keys = []
    for key, field in GGUFReader(path).fields.items():
        if key.startswith("tokenizer."):
            value, sub = _field_value(field)
            keys.append((key, value, field.types[0], sub))
    return tuple(keys)


def copy_tokenizer(path: str, w: GGUFWriter) -> int:
    """Copies path's tokenizer.* keys into w; returns the vocabulary size."""
    n_vocab = 0
    for key, value, vtype, sub in _tokenizer_keys(path):
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        w.add_key_value(key, value, vtype, sub_type=sub)
    if not n_vocab:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens, so it gives no vocabulary")
    return n_vocab


def _write_hparams(w: GGUFWriter, name: str, s: Shape, ctx: int, n_vocab: int) -> None:
    # llama.cpp gives files named like Phi-3 that vocabulary's "</s>" attributes, which the borrowed
    # vocabulary lacks: the phi3 shapes go by their sizes.
    w.add_name(f"synthetic-{name}" if s.arch != "phi3" else f"synthetic-{s.dim}x{s.n_layers}")
    w.add_context_length(ctx)
    w.add_embedding_length(s.dim)
    w.add_block_count(s.n_layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.n_heads)
    if s.attn_layers:   # recurrent layers keep no K/V: head_count_kv 0 marks them
        w.add_head_count_kv([s.n_kv_heads if i in s.attn_layers else 0 for i in range(s.n_layers)])
    elif s.arch == "gemma4":
        w.add_head_count_kv([s.layer_kv_heads(i) for i in range(s.n_layers)])
    else:
        w.add_head_count_kv(s.n_kv_heads)
    if s.arch == "gemma4":   # key_length is the global layers' head, key_length_swa the sliding ones'
        for key, value in (("attention.key_length_swa", s.head), ("attention.value_length_swa", s.head),
                           ("rope.dimension_count_swa", s.head), ("embedding_length_per_layer_input", 0)):
            w.add_uint32(f"gemma4.{key}", value)
        w.add_sliding_window_pattern([s.sliding(i) for i in range(s.n_layers)])
        w.add_rope_freq_base_swa(10000.0)
        w.add_final_logit_softcapping(s.softcap)
    if s.head_dim:
        w.add_key_length(s.global_head_dim or s.head_dim)
        w.add_value_length(s.global_head_dim or s.head_dim)
    w.add_rope_dimension_count(s.global_head_dim or s.head)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.rms_eps)
    if s.n_experts:
        w.add_expert_count(s.n_experts)
        w.add_expert_used_count(s.n_experts_used)
        w.add_expert_feed_forward_length(s.expert_ffn)
    if s.moe_every:
        w.add_uint32(f"{s.arch}.interleave_moe_layer_step", s.moe_every)
    if s.window:
        w.add_sliding_window(s.window)
    if s.yarn:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.yarn[0])
        w.add_rope_scaling_orig_ctx_len(s.yarn[1])
    if s.conv_cache:
        w.add_shortconv_l_cache(s.conv_cache)
    w.add_vocab_size(n_vocab)


# The matrix types --type offers, each with its GGUF file_type.
MATRIX_TYPES = {"F16": (GGMLQuantizationType.F16, 1), "Q8_0": (GGMLQuantizationType.Q8_0, 7)}
Q8_0_BLOCK, Q8_0_BYTES = 32, 34


def _q8_0_byte_shape(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return (*shape[:-1], shape[-1] // Q8_0_BLOCK * Q8_0_BYTES)


def write_model(out: str, name: str, vocab: str, ctx: int = 8192, seed: Optional[int] = None,
                progress: bool = False, matrix_type: str = "F16") -> None:
    """Writes shape `name` with the tokenizer of `vocab` to `out`, one tensor at a time (a 7B model
    never sits in memory whole); matrices in `matrix_type` (F16 or Q8_0), norms F32."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; one of {', '.join(sorted(SHAPES))}")
    if ctx <= 0:
        raise ValueError(f"context length must be positive, got {ctx}")
    if matrix_type not in MATRIX_TYPES:
        raise ValueError(f"unknown matrix type {matrix_type!r}; one of {', '.join(MATRIX_TYPES)}")
    qtype, file_type = MATRIX_TYPES[matrix_type]
    s = SHAPES[name]
    w = GGUFWriter(out, s.arch)
    n_vocab = copy_tokenizer(vocab, w)
    _write_hparams(w, name, s, ctx, n_vocab)
    w.add_file_type(file_type)
    plan = list(tensors(s, n_vocab))
    for tname, shape, norm in plan:
        n = int(np.prod(shape))
        if norm:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), n * 4)
        elif qtype == GGMLQuantizationType.F16:
            w.add_tensor_info(tname, shape, np.dtype(np.float16), n * 2)
        else:
            w.add_tensor_info(tname, _q8_0_byte_shape(shape), np.dtype(np.uint8), n // Q8_0_BLOCK * Q8_0_BYTES,
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    # Slices of one random pool at random offsets: every tensor holds non-trivial values without
    # billions of fresh draws (a 7B model would take minutes more).
    rng = np.random.default_rng(seed)
    # Q8_0 slices whole blocks of the pool quantized once, so no tensor is quantized on its own.
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).astype(np.float16)
    unit = 1
    if qtype == GGMLQuantizationType.Q8_0:
        pool = quantize(pool.astype(np.float32).reshape(-1, Q8_0_BLOCK), qtype).reshape(-1)
        unit = Q8_0_BYTES
    for k, (tname, shape, norm) in enumerate(plan):
        n = int(np.prod(shape))
        if norm:
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32).reshape(shape))
            continue
        size = n if unit == 1 else n // Q8_0_BLOCK * Q8_0_BYTES
        data = np.empty(size, dtype=pool.dtype)
        filled = 0
        while filled < size:
            start = int(rng.integers(0, pool.size // 2 // unit)) * unit
            take = min(size - filled, pool.size - start)
            data[filled:filled + take] = pool[start:start + take]
            filled += take
        w.write_tensor_data(data.reshape(shape if unit == 1 else _q8_0_byte_shape(shape)))
        if progress and k % 20 == 0:
            print(f"  {k + 1}/{len(plan)} {tname}", file=sys.stderr)
    w.close()


def write_vocab(out: str, vocab: str) -> int:
    """Writes only vocab's tokenizer.* keys to out (no tensors); returns the vocabulary size."""
    w = GGUFWriter(out, "llama")
    n_vocab = copy_tokenizer(vocab, w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_vocab


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", help="the model shape (--list names them)")
    ap.add_argument("--vocab", help="GGUF file to take the tokenizer.* metadata from")
    ap.add_argument("--vocab-only", action="store_true", help="write only --vocab's tokenizer keys")
    ap.add_argument("--ctx", type=int, default=8192, help="context_length metadata")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    ap.add_argument("--type", default="F16", choices=sorted(MATRIX_TYPES), help="type of the matrices")
    ap.add_argument("--list", action="store_true", help="print the shapes and exit")
    ap.add_argument("-o", "--out")
    args = ap.parse_args(argv)
    if args.list:
        for name, s in SHAPES.items():
            print(f"{name:15} {s}")
        return
    if not args.vocab or not args.out:
        ap.error("--vocab and -o are required")
    if args.vocab_only:
        print(f"wrote {args.out}: vocabulary of {write_vocab(args.out, args.vocab)} tokens")
        return
    if not args.shape:
        ap.error("--shape is required (or --vocab-only / --list)")
    try:
        write_model(args.out, args.shape, args.vocab, args.ctx, args.seed, progress=True, matrix_type=args.type)
    except ValueError as e:
        ap.error(str(e))
    print(f"wrote {args.out}: {args.shape}")


if __name__ == "__main__":
    main()
