"""Builders of tiny random Hugging Face models and tokenizers for the converter tests, made
offline: tokenizers trained on a local corpus, models from transformers' config classes."""
import copy
import os
import shutil

CORPUS = [
    "The quick brown fox jumps over the lazy dog. She said: \"it's fine, we'll see!\"",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 42; ++i) { sum += a[i] * 3.14159; }",
    "Numbers: 0 1 12 123 1234 12345 3.5e-7 -42 1,000,000 2024-06-01",
    "Punctuation!?... (brackets) [square] {curly} <angle> #hash @at $dollar %percent ^&*_+=|\\/~`",
    "Unicode: café, naïve, Straße, Ελληνικά, русский, 日本語のテキスト, 中文, 한국어",
    "Emoji: 😀 🚀 👍🏽 ❤️ 🇫🇷",
    "Whitespace   runs\t\ttabs\n\n\nnew lines    and  trailing spaces   ",
    "I'm you're they've he'd we'll it's DON'T Can'T",
]

# Text the tokenizers were not trained on, so merges run out and byte fallback is exercised.
TEST_TEXTS = CORPUS + [
    "Zebras zigzag quixotically; 98765 xylophones vex jumpy wizards.",
    "    indented = {'key': [1, 2, 3]}\r\n\r\n",
    "Mixed: naïve🚀rocket 42x 日本 \u00a0nbsp  \u2003emspace",
    "",
    " ",
    "\n",
    "a",
    "ŝ ǅ ẞ ﬀ Å",
]

# The split regex of Llama 3's tokenizer.json (llama.cpp calls this pre-tokenizer "llama-bpe").
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _corpus_lines():
    return [line for _ in range(20) for line in CORPUS]


def bpe_tokenizer(out_dir, vocab_size=400):
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
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                 eos_token="<|end_of_text|>")
    hf.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    hf.save_pretrained(out_dir)
    return hf


def spm_tokenizer(out_dir, vocab_size=400, keep_model=True, add_dummy_prefix=True):
    """A SentencePiece BPE model with byte fallback, saved with transformers' LlamaTokenizer
    (tokenizer.json + tokenizer_config.json; keep_model=False drops tokenizer.model so only the
    HF files describe it). Identity normalization: llama.cpp's SentencePiece tokenizer does not
    collapse whitespace. Returns (LlamaTokenizer, transformers' SentencePiece-backed tokenizer).
    The second is the reference: the tokenizers-based LlamaTokenizer skips the dummy prefix when
    the text already starts with a space, unlike SentencePiece itself (and llama.cpp).
    add_dummy_prefix=False trains a model like Gemma's, which adds no space before the text."""
    import sentencepiece as spm
    from transformers import LlamaTokenizer
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(_corpus_lines()))
    prefix = os.path.join(out_dir, "sp")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, add_dummy_prefix=add_dummy_prefix, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2)
    os.remove(corpus)
    os.remove(prefix + ".vocab")
    model_path = os.path.join(out_dir, "tokenizer.model")
    shutil.move(prefix + ".model", model_path)
    reference = SentencePieceBackend(vocab_file=model_path, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf = LlamaTokenizer.from_pretrained(out_dir)
    hf.save_pretrained(out_dir)
    if not keep_model:
        os.remove(model_path)
    return hf, reference


def _randomize_(model, seed):
    """transformers initialises norms to ones and biases to zeros; random values make the test
    see a swapped or misplaced norm/bias."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def tiny_model(out_dir, arch, vocab_size, tied=False, shard=False, dtype="float32", seed=0, **overrides):
    """A small random model of arch ("llama", "mistral", "qwen2", "qwen3", "gemma3"; 2 layers of
    hidden 64 unless overridden) saved as safetensors (sharded into several files when shard).
    Returns the model in float32 with exactly the weights that were saved (rounded to dtype), as
    the reference."""
    import torch
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM)}
    config_cls, model_cls = classes[arch]
    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    if arch in ("llama", "mistral") and "rope_parameters" not in overrides:
        kw["rope_theta"] = 50000.0
    if arch == "gemma3":
        # query_pre_attn_scalar = head_dim: the attention scale llama.cpp's gemma3 assumes.
        kw.update(head_dim=16, query_pre_attn_scalar=16, pad_token_id=0)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kw))
    if arch == "gemma3":
        model.config._attn_implementation = "eager"   # the implementation Gemma's authors recommend
    model.eval()
    _randomize_(model, seed)
    torch_dtype = getattr(torch, dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch_dtype).to(torch.float32))
    # A copy is cast for saving: casting the reference would also round its rope buffers.
    copy.deepcopy(model).to(torch_dtype).save_pretrained(out_dir, max_shard_size="40KB" if shard else "10GB")
    return model


def hf_logits(ref, ids):
    """transformers' logits [len(ids), n_vocab] for one sequence."""
    import torch
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].numpy()


def ember_logits(path, ids, n_gpu_layers=0, kv_type="f32", chunk=64):
    """ember's logits [len(ids), n_vocab], the ids evaluated `chunk` at a time. By default on the
    CPU with an f32 KV cache: the comparison is with transformers' f32 attention, not llama.cpp's
    f16 cache."""
    import numpy as np
    from ember import _ember
    m = _ember.Model(str(path), n_gpu_layers=n_gpu_layers)
    ctx = _ember.Context(m, n_ctx=64, n_batch=64, n_threads=2, kv_type=kv_type)
    rows = []
    for start in range(0, len(ids), chunk):
        piece = ids[start:start + chunk]
        ctx.eval(piece, logits_all=True)
        rows += [np.asarray(ctx.logits(i)) for i in range(len(piece))]
    return np.stack(rows)
