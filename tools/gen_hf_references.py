"""Writes tests/reference/hf: what transformers says about the tiny models and tokenizers of the
converter and embedding tests, so that those tests run without torch or transformers.

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python:tests python tools/gen_hf_references.py [--out DIR]

Needs CPU torch, transformers, tokenizers, sentencepiece, a built ember (for its ChatML template)
and the SmolLM2 GGUF the tests fetch (for its chat template). Steps: train the tokenizers and save them with
transformers; save each tiny model once with transformers to record its layout (config.json,
tensor names and shapes, shards); build the checkpoints the tests build (tests/hf_tiny.py: seeded
numpy weights in that layout); load those back with transformers and record its logits, hidden
states, token ids and chat prompts. The tests' hf_live variants use LiveReference directly, and
tests/test_convert.py's hf_live test reruns this into a temporary folder and compares."""
import argparse
import hashlib
import io
import json
import os
import pathlib
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import hf_tiny  # noqa: E402

# The split regex of Llama 3's tokenizer.json (llama.cpp calls this pre-tokenizer "llama-bpe").
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKENIZER_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                           "{% endfor %}")


@dataclass(frozen=True)
class Tiny:
    """A tiny random model: 2 layers of hidden 64 unless overrides (transformers config arguments)
    say otherwise; logits are recorded on `prompt`."""
    arch: str
    tokenizer: str
    seed: int
    tied: bool = False
    shard: bool = False          # several safetensors files of at most 40 KB
    dtype: str = "float32"       # as stored
    extra_vocab: int = 0         # embedding rows past the tokenizer's tokens
    overrides: dict = field(default_factory=dict)
    prompt: tuple = ()


_LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
_GEMMA_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
_SHORT, _LONG = tuple(hf_tiny.SHORT_PROMPT), tuple(hf_tiny.LONG_PROMPT)
_PHI3 = dict(sliding_window=8, original_max_position_embeddings=32, pad_token_id=0, rope_parameters={
    "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
    "short_factor": [1.0, 1.3, 2.1, 3.7], "long_factor": [1.2, 2.5, 4.0, 9.0]})

_QWEN35 = dict(head_dim=16, rms_norm_eps=1e-6, pad_token_id=0, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_conv_kernel_dim=4, rope_parameters={
                   "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                   "mrope_section": [2, 1, 1]})

MODELS = {
    # tests/test_convert.py
    "llama-untied-sharded-bf16": Tiny("llama", "bpe", 0, shard=True, dtype="bfloat16", prompt=_SHORT),
    "mistral-tied": Tiny("mistral", "bpe", 1, tied=True, prompt=_SHORT),
    "qwen2-untied-sharded-padded": Tiny("qwen2", "bpe", 2, shard=True, extra_vocab=8, prompt=_SHORT),
    # The tokenizer tests put each of their tokenizers (all of 400 tokens) in this one.
    "tokenizer-llama": Tiny("llama", "bpe", 0),
    # tests/test_arch_hf.py
    "qwen3": Tiny("qwen3", "bpe", 0, overrides=dict(head_dim=24), prompt=_LONG),
    "gemma3": Tiny("gemma3", "spm-nodummy", 1, tied=True, overrides=dict(num_hidden_layers=7, sliding_window=8),
                   prompt=_LONG),
    "gemma3-linear-period3": Tiny("gemma3", "spm-nodummy", 2, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=7, sliding_window=8, layer_types=["sliding_attention", "sliding_attention",
                                                            "full_attention"] * 2 + ["sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 4.0},
                         **_GEMMA_ROPE})),
    "llama-llama3": Tiny("llama", "bpe", 3, overrides=dict(rope_parameters=_LLAMA3), prompt=_LONG),
    "llama-linear": Tiny("llama", "bpe", 4, prompt=_LONG, overrides=dict(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "llama-yarn": Tiny("llama", "bpe", 5, prompt=_LONG, overrides=dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0})),
    # Mixtures: 8 experts of which 2 are used per token.
    "qwen3moe": Tiny("qwen3moe", "bpe", 9, prompt=_LONG, overrides=dict(
        head_dim=24, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)),
    "qwen3moe-unnormed": Tiny("qwen3moe", "bpe", 10, prompt=_LONG, overrides=dict(
        moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False)),
    "mixtral": Tiny("mixtral", "bpe", 11, prompt=_LONG, overrides=dict(
        intermediate_size=48, num_local_experts=8, num_experts_per_tok=2)),
    # gpt-oss in bf16 as its unquantized releases; 4 layers, sliding ones with a window of 8, YaRN
    # (unrounded, as gpt-oss's) from an original context of 32.
    "gpt-oss": Tiny("gpt-oss", "bpe", 12, dtype="bfloat16", prompt=_LONG, overrides=dict(
        num_hidden_layers=4, head_dim=16, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=8, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                           "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                           "beta_slow": 1.0, "truncate": False})),
    # tests/test_arch_fused.py: Phi-3 rotating half of each head, LongRoPE from an original context of
    # 32 (the long prompt takes the long factors, the short one the short), a window of 8.
    "phi3": Tiny("phi3", "bpe", 18, prompt=_LONG, overrides=_PHI3),
    "phi3-short": Tiny("phi3", "bpe", 19, prompt=_SHORT, overrides=_PHI3),
    # Ministral 3: YaRN from an original context of 16 with mscale_all_dim 0.5 (a magnitude other than
    # 1), llama 4's attention temperature (beta 0.3) growing every 16 positions of the long prompt.
    "ministral3": Tiny("ministral3", "bpe", 20, prompt=_LONG, overrides=dict(head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5, "llama_4_scaling_beta": 0.3})),
    # GLM-4: half of each 16-wide head rotated on adjacent pairs, Q/K/V biases, four norms a block.
    "glm4": Tiny("glm4", "bpe", 21, prompt=_LONG, overrides=dict(head_dim=16, pad_token_id=0)),
    # Command R (tied head, logit scale far from 1) and cohere2 (8 layers: windows of 8 on three of
    # each four, the fourth global without rope).
    "command-r": Tiny("cohere", "bpe", 22, tied=True, prompt=_LONG, overrides=dict(logit_scale=0.3)),
    "cohere2": Tiny("cohere2", "bpe", 23, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=8, sliding_window=8, logit_scale=0.3)),
    # tests/test_arch_chat.py: the chat families. Gemma 2 with 4 layers alternating a window of 8 and
    # caps small enough to bend the tiny model's scores and logits; OLMo 2, and OLMo 3 with three
    # windowed layers of four; Granite with muP multipliers far from 1; SmolLM3 with 4 layers (the
    # last without rope).
    "gemma2": Tiny("gemma2", "spm-nodummy", 13, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, sliding_window=8, attn_logit_softcapping=0.8, final_logit_softcapping=1.0)),
    "olmo2": Tiny("olmo2", "bpe", 14, prompt=_LONG),
    "olmo3": Tiny("olmo3", "bpe", 15, prompt=_LONG, overrides=dict(num_hidden_layers=4, sliding_window=8)),
    "granite": Tiny("granite", "bpe", 16, prompt=_LONG, overrides=dict(
        embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.5, logits_scaling=2.5)),
    "smollm3": Tiny("smollm3", "bpe", 17, prompt=_LONG, overrides=dict(num_hidden_layers=4, pad_token_id=0)),
    # tests/test_arch_gemma4.py: Gemma 4 with 6 layers alternating a window of 8 (heads of 16) and global
    # layers (heads of 32, a quarter rotated, one KV head whose values are the keys' projection); the
    # last two layers read the KV of layers 2 and 3; per-layer embeddings of 8; logits capped at 1.
    "gemma4": Tiny("gemma4", "spm-nodummy", 24, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=6, sliding_window=8, global_head_dim=32, attention_k_eq_v=True,
        num_global_key_value_heads=1, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        final_logit_softcapping=1.0, layer_types=["sliding_attention", "full_attention"] * 3)),
    # and Gemma 4 as the E models' feed-forwards and the 31B's values: 5 layers, the last two reading the
    # KV of layers 1 and 2 with feed-forwards twice as wide; global layers with V projections and the
    # sliding layers' KV heads; no per-layer embeddings, no cap.
    "gemma4-wide": Tiny("gemma4", "spm-nodummy", 27, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=5, intermediate_size=96, sliding_window=8, global_head_dim=32, num_kv_shared_layers=2,
        use_double_wide_mlp=True, hidden_size_per_layer_input=0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] + ["sliding_attention",
                                                                                      "full_attention"])),
    # tests/test_arch_gemma4_moe.py: Gemma 4 26B-A4B's mixture: 4 layers alternating sliding and global ones
    # (values from the keys' projection), each a dense MLP of 96 beside 4 GeGLU experts of 32, top 2.
    "gemma4-moe": Tiny("gemma4", "spm-nodummy", 28, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, intermediate_size=96, sliding_window=8, global_head_dim=32, attention_k_eq_v=True,
        num_global_key_value_heads=1, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
        final_logit_softcapping=1.0, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        layer_types=["sliding_attention", "full_attention"] * 2)),
    # tests/test_arch_llama4.py: Llama 4 with 4 layers (chunks of 8 on layers 0-2, layer 3 NoPE with the
    # attention temperature every 8 positions), mixture layers 1 and 3 (4 experts, top 1, a shared
    # expert) between dense ones; and Command R+ (Command R with per-head q/k LayerNorms).
    "llama4": Tiny("llama4", "bpe", 25, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, head_dim=16, intermediate_size=48, intermediate_size_mlp=160, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8, floor_scale=8, attn_scale=0.5,
        pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "command-r-plus": Tiny("cohere", "bpe", 26, tied=True, prompt=_LONG, overrides=dict(logit_scale=0.3,
                                                                                          use_qk_norm=True)),
    # tests/test_arch_hybrid.py: Qwen3.5 with gated DeltaNet layers 0, 1 and 3 (2 k heads, 4 v heads, so
    # the converter's v-head reordering matters) and gated attention in layer 2 (half of each head rotated);
    # qwen35-narrow-v has v heads narrower than its k heads (llama.cpp's loader assumes them equal).
    "qwen35": Tiny("qwen35", "bpe", 44, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_value_head_dim=16, **_QWEN35)),
    "qwen35-narrow-v": Tiny("qwen35", "bpe", 45, prompt=_LONG, overrides=dict(
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], linear_value_head_dim=8, **_QWEN35)),
    # tests/test_arch_hybrid.py: Qwen3.5-MoE as qwen35 with 4 experts (top 2) and a gated shared expert
    # wider than the routed ones; Qwen3-Next alike, its v heads grouped by k head and plain NeoX rope.
    "qwen35moe": Tiny("qwen35moe", "bpe", 46, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, **_QWEN35)),
    "qwen3next": Tiny("qwen3next", "bpe", 47, prompt=_LONG, overrides=dict(
        num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"], head_dim=16,
        rms_norm_eps=1e-6, pad_token_id=0, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    # tests/test_arch_lfm2.py: LFM2 with short-convolution layers 0, 1 and 3 around an attention layer, the
    # feed-forward width its block_auto_adjust_ff_dim makes (2/3 of 160 rounded up to 32s: 128), a tied head;
    # lfm2-untied: attention first, a convolution of length 4, no width adjustment, an untied head.
    "lfm2": Tiny("lfm2", "bpe", 60, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"], block_multiple_of=32,
        norm_eps=1e-5)),
    "lfm2-untied": Tiny("lfm2", "bpe", 61, prompt=_LONG, overrides=dict(
        layer_types=["full_attention", "conv"], conv_L_cache=4, block_auto_adjust_ff_dim=False, norm_eps=1e-5)),
    # lfm2moe: LFM2-MoE with a dense first layer, then mixtures of 4 experts (top 2) chosen by sigmoid score
    # plus the expert bias, on convolution and attention layers alike.
    "lfm2moe": Tiny("lfm2moe", "bpe", 62, tied=True, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"], num_dense_layers=1,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_eps=1e-5)),
    # tests/test_arch_mamba2.py: Nemotron-H with Mamba2 layers 0 and 3 (8 heads of 16, 2 groups of B and C,
    # states of 16), attention (no rope) in layer 2 and squared-ReLU MLPs in layers 1 and 4; Granite 4.0
    # hybrid with Mamba2 layers 0, 1 and 3 around an attention layer, each with a SwiGLU feed-forward, and
    # muP multipliers away from 1.
    "nemotron_h": Tiny("nemotron_h", "bpe", 70, prompt=_LONG, overrides=dict(
        layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention", "mlp"], head_dim=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, layer_norm_epsilon=1e-5)),
    # nemotron_h_moe (Nemotron 3): its MLPs mixtures of 4 squared-ReLU experts of 32 (top 2 by sigmoid score plus
    # the correction bias, renormalized, scaled 1.5) beside a shared expert of 48.
    "nemotron_h_moe": Tiny("nemotron_h", "bpe", 73, prompt=_LONG, overrides=dict(
        layers_block_type=["linear_attention", "moe", "full_attention", "linear_attention", "moe"], head_dim=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, layer_norm_epsilon=1e-5,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
        n_group=1, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True)),
    "granitehybrid": Tiny("granitehybrid", "bpe", 71, prompt=_LONG, overrides=dict(
        num_hidden_layers=4, layer_types=["mamba", "mamba", "attention", "mamba"], shared_intermediate_size=160,
        num_local_experts=0, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.5, logits_scaling=2.5)),
    # and its mixture (as granite-4.0-h-tiny): 4 SwiGLU experts of 32 (top 2) beside a shared expert of 48.
    "granitehybrid-moe": Tiny("granitehybrid", "bpe", 72, prompt=_LONG, overrides=dict(
        num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], intermediate_size=32,
        shared_intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.5, logits_scaling=2.5)),
    # tests/test_arch_deepseek2.py: DeepSeek V3 with 3 layers (the first dense), latent attention through a
    # q_lora_rank of 48 and a kv_lora_rank of 32 (heads of 16 + 8 rotated key dims, values of 24), 8 experts in
    # 4 groups of which 2 are chosen from (top 2, renormalized, times 2.5), a shared expert and YaRN from an
    # original context of 32 with mscale_all_dim 0.707; DeepSeek V2 with plain queries, softmax routing (top 3,
    # times 1.5) and two shared experts.
    "deepseek-v3": Tiny("deepseek_v3", "bpe", 80, prompt=_LONG, overrides=dict(
        num_hidden_layers=3, num_key_value_heads=4, first_k_dense_replace=1, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                              "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})),
    "deepseek-v2": Tiny("deepseek_v2", "bpe", 81, prompt=_LONG, overrides=dict(
        num_key_value_heads=4, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
        n_shared_experts=2, routed_scaling_factor=1.5)),
    # GLM-4.7-Flash's class (Glm4MoeLiteForCausalLM, a deepseek2 file): latent attention as deepseek-v3's, the
    # first layer dense by its mlp_layer_types, sigmoid routing with a selection bias, one group, top 2 of 8,
    # renormalized and times 1.8, a shared expert.
    "glm-4.7-flash": Tiny("glm4_moe_lite", "bpe", 82, prompt=_LONG, overrides=dict(
        num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=24, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True)),
    # tests/test_embeddings.py
    "embed-llama": Tiny("llama", "bpe", 7),
}
# Multimodal checkpoints: name -> (its text model, seed of the other weights). tests/test_arch_hf.py
# converts this one and expects the file of its text model.
MULTIMODAL = {"gemma3-multimodal": ("gemma3", 8)}
_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
               patch_size=14)

# Tokenizer -> the transformers tokenizers whose ids are recorded: "fast" (tokenizer.json) and
# "sentencepiece" (transformers' SentencePiece-backed tokenizer, which adds SentencePiece's dummy
# prefix even before a leading space, as llama.cpp does; the fast one does not).
ENCODERS = {"bpe": ("fast",), "spm": ("fast", "sentencepiece"), "spm-nodummy": ("sentencepiece",)}

# ---- tokenizers


def _corpus_lines():
    return "\n".join(line for _ in range(20) for line in hf_tiny.CORPUS).split("\n")


def _bpe_tokenizer(out_dir, vocab_size=400):
    """Byte-level BPE with the llama-bpe split, saved as a PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus_lines(), trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    hf.chat_template = TOKENIZER_CHAT_TEMPLATE
    hf.save_pretrained(out_dir)


def _spm_model(add_dummy_prefix, vocab_size=400):
    """A SentencePiece BPE model with byte fallback, trained in memory (a model trained from files
    records their paths). Identity normalization: llama.cpp's SentencePiece tokenizer does not
    collapse whitespace. add_dummy_prefix=False makes a model like Gemma's."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus_lines()), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, add_dummy_prefix=add_dummy_prefix, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, minloglevel=2)
    return model.getvalue()


def write_tokenizers(out_dir):
    """bpe; spm (tokenizer.model and the files transformers' LlamaTokenizer saves); spm-nodummy
    (tokenizer.model and a tokenizer_config.json asking for BOS, as Gemma's)."""
    from transformers import LlamaTokenizer

    _bpe_tokenizer(os.path.join(out_dir, "bpe"))
    spm_dir = os.path.join(out_dir, "spm")
    os.makedirs(spm_dir)
    pathlib.Path(spm_dir, "tokenizer.model").write_bytes(_spm_model(True))
    LlamaTokenizer.from_pretrained(spm_dir).save_pretrained(spm_dir)
    gemma_dir = os.path.join(out_dir, "spm-nodummy")
    os.makedirs(gemma_dir)
    pathlib.Path(gemma_dir, "tokenizer.model").write_bytes(_spm_model(False))
    with open(os.path.join(gemma_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>"}, f, indent=2)


def _tokenizer(tok_dir, backend):
    from transformers import LlamaTokenizer, PreTrainedTokenizerFast
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    if backend == "sentencepiece":
        return SentencePieceBackend(vocab_file=os.path.join(tok_dir, "tokenizer.model"), bos_token="<s>",
                                    eos_token="</s>", unk_token="<unk>")
    if os.path.exists(os.path.join(tok_dir, "tokenizer.model")):
        return LlamaTokenizer.from_pretrained(tok_dir)
    return PreTrainedTokenizerFast.from_pretrained(tok_dir)


# ---- model layouts


def _config(tiny, n_tokens):
    from transformers import (Cohere2Config, CohereConfig, Gemma2Config, Gemma3TextConfig, Gemma4TextConfig,
                              Glm4Config, GptOssConfig, GraniteConfig, GraniteMoeHybridConfig, Lfm2Config,
                              Lfm2MoeConfig, Llama4TextConfig, LlamaConfig,
                              Ministral3Config, NemotronHConfig,
                              MistralConfig, MixtralConfig, Olmo2Config, Olmo3Config, Phi3Config, Qwen2Config,
                              Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3Config, Qwen3MoeConfig, Qwen3NextConfig,
                              SmolLM3Config)

    kw = dict(vocab_size=n_tokens + tiny.extra_vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
              tie_word_embeddings=tiny.tied, bos_token_id=1, eos_token_id=2)
    if tiny.arch in ("llama", "mistral") and "rope_parameters" not in tiny.overrides:
        kw["rope_theta"] = 50000.0
    if tiny.arch in ("gemma3", "gemma2"):
        # query_pre_attn_scalar = head_dim: the attention scale llama.cpp's gemma3 assumes.
        kw.update(head_dim=16, query_pre_attn_scalar=16, pad_token_id=0)
    if tiny.arch == "gemma4":
        kw.update(head_dim=16, pad_token_id=0, vocab_size_per_layer_input=kw["vocab_size"])
    kw.update(tiny.overrides)
    from transformers import DeepseekV2Config, DeepseekV3Config, Glm4MoeLiteConfig

    classes = {"deepseek_v2": DeepseekV2Config, "deepseek_v3": DeepseekV3Config, "glm4_moe_lite": Glm4MoeLiteConfig,
               "llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
               "gemma3": Gemma3TextConfig, "qwen3moe": Qwen3MoeConfig, "mixtral": MixtralConfig,
               "gpt-oss": GptOssConfig, "phi3": Phi3Config, "ministral3": Ministral3Config,
               "glm4": Glm4Config, "gemma2": Gemma2Config, "olmo2": Olmo2Config, "olmo3": Olmo3Config,
               "granite": GraniteConfig, "smollm3": SmolLM3Config, "cohere": CohereConfig, "cohere2": Cohere2Config,
               "gemma4": Gemma4TextConfig, "llama4": Llama4TextConfig, "qwen35": Qwen3_5TextConfig,
               "lfm2": Lfm2Config, "lfm2moe": Lfm2MoeConfig, "nemotron_h": NemotronHConfig,
               "granitehybrid": GraniteMoeHybridConfig,
               "qwen35moe": Qwen3_5MoeTextConfig, "qwen3next": Qwen3NextConfig}
    return classes[tiny.arch](**kw)


def _saved_layout(model, dtype, shard, work):
    """config.json (less transformers' version), tensor shapes and shard index as save_pretrained
    writes them for `model`."""
    import torch
    from safetensors import safe_open

    shutil.rmtree(work, ignore_errors=True)
    model.to(getattr(torch, dtype)).save_pretrained(work, max_shard_size="40KB" if shard else "10GB")
    with open(os.path.join(work, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config.pop("transformers_version", None)
    tensors = {}
    for name in sorted(os.listdir(work)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(work, name), framework="pt") as f:
                tensors.update({k: f.get_slice(k).get_shape() for k in f.keys()})
    index_path = os.path.join(work, "model.safetensors.index.json")
    index = None
    if os.path.exists(index_path):
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    return {"config": config, "tensors": dict(sorted(tensors.items())), "index": index, "dtype": dtype}


def model_layouts(tok_root, work):
    """name -> layout, tokenizer and seed of every tiny model (models.json)."""
    from transformers import (Cohere2ForCausalLM, CohereForCausalLM, Gemma2ForCausalLM, Gemma3Config, Gemma3ForCausalLM,
                              Gemma3ForConditionalGeneration, Gemma4ForCausalLM, Glm4ForCausalLM, GptOssForCausalLM,
                              GraniteForCausalLM, GraniteMoeHybridForCausalLM, Lfm2ForCausalLM, Llama4ForCausalLM,
                              Lfm2MoeForCausalLM, LlamaForCausalLM,
                              Ministral3ForCausalLM, NemotronHForCausalLM,
                              MistralForCausalLM, MixtralForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM,
                              Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM,
                              Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, SmolLM3ForCausalLM)

    from transformers import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Glm4MoeLiteForCausalLM

    classes = {"deepseek_v2": DeepseekV2ForCausalLM, "deepseek_v3": DeepseekV3ForCausalLM,
               "glm4_moe_lite": Glm4MoeLiteForCausalLM,
               "llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM,
               "qwen3": Qwen3ForCausalLM, "gemma3": Gemma3ForCausalLM, "qwen3moe": Qwen3MoeForCausalLM,
               "mixtral": MixtralForCausalLM, "gpt-oss": GptOssForCausalLM, "phi3": Phi3ForCausalLM,
               "ministral3": Ministral3ForCausalLM, "glm4": Glm4ForCausalLM, "gemma2": Gemma2ForCausalLM,
               "olmo2": Olmo2ForCausalLM, "olmo3": Olmo3ForCausalLM, "granite": GraniteForCausalLM,
               "smollm3": SmolLM3ForCausalLM, "cohere": CohereForCausalLM, "cohere2": Cohere2ForCausalLM,
               "gemma4": Gemma4ForCausalLM, "llama4": Llama4ForCausalLM, "qwen35": Qwen3_5ForCausalLM,
               "lfm2": Lfm2ForCausalLM, "lfm2moe": Lfm2MoeForCausalLM, "nemotron_h": NemotronHForCausalLM,
               "granitehybrid": GraniteMoeHybridForCausalLM,
               "qwen35moe": Qwen3_5MoeForCausalLM, "qwen3next": Qwen3NextForCausalLM}
    out, configs = {}, {}
    for name, tiny in MODELS.items():
        backend = ENCODERS[tiny.tokenizer][0]
        configs[name] = _config(tiny, len(_tokenizer(os.path.join(tok_root, tiny.tokenizer), backend)))
        layout = _saved_layout(classes[tiny.arch](configs[name]), tiny.dtype, tiny.shard, os.path.join(work, name))
        out[name] = {**layout, "tokenizer": tiny.tokenizer, "seed": tiny.seed}
    for name, (text, seed) in MULTIMODAL.items():
        config = Gemma3Config(text_config=configs[text].to_dict(), vision_config=_VISION, mm_tokens_per_image=4)
        layout = _saved_layout(Gemma3ForConditionalGeneration(config), MODELS[text].dtype, False,
                               os.path.join(work, name))
        out[name] = {**layout, "tokenizer": MODELS[text].tokenizer, "seed": seed, "text_model": text}
    return out


# ---- transformers' outputs


def load_model(model_dir):
    """The checkpoint in float32 with transformers' class for it; every tensor must be one the
    class expects and every parameter must be in the checkpoint."""
    import torch
    import transformers

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    cls = getattr(transformers, config["architectures"][0])
    # eager: the attention implementation Gemma's authors recommend, and the one with gpt-oss's sinks
    # and Gemma 2's soft-capping.
    extra = ({"attn_implementation": "eager"}
             if config["model_type"] in ("gemma3_text", "gemma3", "gpt_oss", "gemma2", "gemma4_text") else {})
    model, info = cls.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True, **extra)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{model_dir}: {problems}"
    return model.eval()


class LiveReference:
    """transformers' outputs computed now, on the checkpoints hf_tiny builds from `root`; the same
    methods as hf_tiny.CommittedReference."""

    def __init__(self, root, workdir):
        self.root, self.workdir = pathlib.Path(root), pathlib.Path(workdir)
        self._models, self._tokenizers = {}, {}

    def model(self, name):
        if name not in self._models:
            model_dir = self.workdir / name
            hf_tiny.build(name, str(model_dir), root=self.root)
            self._models[name] = load_model(str(model_dir))
        return self._models[name]

    def logits(self, model, ids):
        import torch
        with torch.no_grad():
            return self.model(model)(torch.tensor([list(ids)])).logits[0].numpy()

    def hidden(self, model, ids):
        import torch
        with torch.no_grad():
            return self.model(model).model(torch.tensor([list(ids)])).last_hidden_state[0].numpy()

    def inv_freq(self, model):
        return self.model(model).model.rotary_emb.inv_freq.numpy()

    def _tok(self, tokenizer, backend):
        if (tokenizer, backend) not in self._tokenizers:
            self._tokenizers[tokenizer, backend] = _tokenizer(str(self.root / "tokenizers" / tokenizer), backend)
        return self._tokenizers[tokenizer, backend]

    def encode(self, tokenizer, text, add_special_tokens=True, backend="fast"):
        return list(self._tok(tokenizer, backend).encode(text, add_special_tokens=add_special_tokens))

    def tokenizer(self, tokenizer):
        tok = self._tok(tokenizer, "fast")
        return {"n_tokens": len(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                "chat_template": tok.chat_template, "vocab": dict(sorted(tok.get_vocab().items()))}

    def render(self, source, messages, **kwargs):
        """apply_chat_template on a tokenizer that is only the template and special tokens."""
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                      bos_token="<|im_start|>", eos_token="<|im_end|>")
        return tok.apply_chat_template(messages, chat_template=source, tokenize=False, **kwargs)


def _smollm2_template(smollm2_path):
    import gguf
    return gguf.GGUFReader(smollm2_path).fields["tokenizer.chat_template"].contents()


def outputs(live, smollm2_path):
    """(tables, arrays) of outputs.json and outputs.npz: every output the tests look up."""
    from ember.chat import CHATML

    tables = {k: [] for k in ("logits", "hidden", "inv_freq", "encode", "tokenizer", "render")}
    arrays = {}

    def record(table, array=None, **entry):
        if array is not None:
            entry["array"] = f"{table}_{len(tables[table])}"
            arrays[entry["array"]] = np.asarray(array, dtype=np.float32)
        tables[table].append(entry)

    # Every checkpoint must load without a missing or unexpected tensor, with a prompt or not.
    for name, tiny in MODELS.items():
        live.model(name)
        if tiny.prompt:
            record("logits", live.logits(name, tiny.prompt), model=name, ids=list(tiny.prompt))
    for name in MULTIMODAL:
        live.model(name)
    record("inv_freq", live.inv_freq("llama-llama3"), model="llama-llama3")
    for ids in (hf_tiny.EMBED_IDS, live.encode("bpe", hf_tiny.EMBED_TEXT)):
        record("hidden", live.hidden("embed-llama", ids), model="embed-llama", ids=list(ids))
    for tokenizer, backends in ENCODERS.items():
        texts = hf_tiny.TEST_TEXTS + ([hf_tiny.SPECIAL_TEXT] if tokenizer == "bpe" else [])
        for backend in backends:
            for text in texts:
                for add in (False, True):
                    record("encode", tokenizer=tokenizer, backend=backend, text=text, add_special_tokens=add,
                           ids=live.encode(tokenizer, text, add, backend))
    for tokenizer in ("bpe", "spm"):
        record("tokenizer", tokenizer=tokenizer, info=live.tokenizer(tokenizer))
    smollm2 = _smollm2_template(smollm2_path)
    cases = [(smollm2, m, {"add_generation_prompt": g}) for m in (hf_tiny.CHAT_MESSAGES, hf_tiny.CHAT_MESSAGES[1:2])
             for g in (True, False)]
    cases.append((CHATML, hf_tiny.CHAT_MESSAGES[:2], {"add_generation_prompt": True}))
    for source, messages, kwargs in cases:
        record("render", template_sha256=hashlib.sha256(source.encode()).hexdigest(), messages=messages,
               kwargs=kwargs, text=live.render(source, messages, **kwargs))
    return tables, arrays


def _write_json(path, value):
    """value's entries, and a list's items, one per line: small diffs when a reference changes."""
    def rows(v):
        if isinstance(v, list):
            return "[\n" + ",\n".join(json.dumps(x, ensure_ascii=False, sort_keys=True) for x in v) + "\n]"
        return json.dumps(v, ensure_ascii=False, sort_keys=True)
    body = ",\n".join(f"{json.dumps(k)}: {rows(v)}" for k, v in value.items())
    pathlib.Path(path).write_text("{\n" + body + "\n}\n", encoding="utf-8")


def generate(out, smollm2_path, work):
    """Writes every generated file of tests/reference/hf into `out` (README.md is not one)."""
    out, work = pathlib.Path(out), pathlib.Path(work)
    shutil.rmtree(out / "tokenizers", ignore_errors=True)
    write_tokenizers(str(out / "tokenizers"))
    layouts = model_layouts(str(out / "tokenizers"), str(work / "layouts"))
    _write_json(out / "models.json", layouts)
    # The weights' hash lets a test notice a build that is not the one computed on here.
    for name in layouts:
        hf_tiny.build(name, str(work / "built" / name), root=out)
        layouts[name]["sha256"] = hf_tiny.weights_sha256(str(work / "built" / name))
    _write_json(out / "models.json", layouts)
    tables, arrays = outputs(LiveReference(out, work / "live"), smollm2_path)
    _write_json(out / "outputs.json", tables)
    np.savez_compressed(out / "outputs.npz", **arrays)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(hf_tiny.REFERENCE), help="folder to write (default: %(default)s)")
    args = parser.parse_args(argv)
    from conftest import _fetch_smollm2
    from transformers.utils import logging

    logging.disable_progress_bar()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        generate(args.out, str(_fetch_smollm2()), work)


if __name__ == "__main__":
    main()
