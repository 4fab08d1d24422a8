#!/usr/bin/env python3
"""Write the fuzzers' inputs: the seed corpus (tests/fuzz/corpus/<target>/) and the tokenizer
fuzzer's vocabularies (tests/fuzz/vocab/), vocab-only GGUFs:

    smollm2.gguf.gz  byte-level BPE: SmolLM2's tokenizer.* keys (tools/synthetic_gguf.py --vocab-only),
                     gzipped (1.7 MB -> 0.5 MB); the fuzz build unpacks it
    spm.gguf         SentencePiece BPE with byte fallback, 700 tokens, trained on the Apache-2.0
                     text of tests/reference/smollm2, with one user-defined token

    make_inputs.py [SmolLM2-135M-Instruct.Q4_1.gguf]   (default: the test cache's copy)

Seeds are starting points only: the fuzzers find their own inputs from them.
"""
import gzip
import io
import pathlib
import struct
import subprocess
import sys
import tempfile

import sentencepiece as spm
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fuzz" / "vocab"
CORPUS = ROOT / "tests" / "fuzz" / "corpus"


def write_smollm2(model: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = pathlib.Path(tmp) / "vocab.gguf"
        subprocess.run([sys.executable, str(ROOT / "tools" / "synthetic_gguf.py"), "--vocab-only",
                        "--vocab", str(model), "-o", str(raw)], check=True)
        # mtime=0: the same input gives the same bytes.
        (OUT / "smollm2.gguf.gz").write_bytes(gzip.compress(raw.read_bytes(), compresslevel=9, mtime=0))


def write_spm() -> None:
    text = (ROOT / "tests" / "reference" / "smollm2" / "apache-2.0.txt").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=700, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, character_coverage=1.0, user_defined_symbols=["<|im_start|>"],
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
             else 5 if sp.is_unused(i) else 4 if sp.id_to_piece(i) == "<|im_start|>" else 1 for i in range(n)]
    w = GGUFWriter(str(OUT / "spm.gguf"), "llama")
    w.add_key_value("tokenizer.ggml.model", "llama", GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.tokens", [sp.id_to_piece(i) for i in range(n)], GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.scores", [sp.get_score(i) for i in range(n)], GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.FLOAT32)
    w.add_key_value("tokenizer.ggml.token_type", types, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    for key, value in (("bos", sp.bos_id()), ("eos", sp.eos_id()), ("unknown", sp.unk_id())):
        w.add_key_value(f"tokenizer.ggml.{key}_token_id", value, GGUFValueType.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf_seeds() -> None:
    """Small files that reach every value type, nested arrays, tensors of block types, an
    alignment key and a tokenizer; plus the SentencePiece vocabulary."""
    d = CORPUS / "gguf"
    d.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(d / "tensors.gguf"), "llama")
    w.add_custom_alignment(64)
    w.add_key_value("u8", 7, GGUFValueType.UINT8)
    w.add_key_value("i16", -3, GGUFValueType.INT16)
    w.add_key_value("u64", 1 << 40, GGUFValueType.UINT64)
    w.add_key_value("f64", 0.25, GGUFValueType.FLOAT64)
    w.add_key_value("b", True, GGUFValueType.BOOL)
    w.add_key_value("nested", [[1, 2], [3]], GGUFValueType.ARRAY, sub_type=GGUFValueType.ARRAY)
    w.add_tensor("f32", np.arange(8, dtype=np.float32))
    w.add_tensor("q8", np.zeros(34, dtype=np.uint8), raw_shape=(34,), raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("f16", np.ones((2, 3), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    w = GGUFWriter(str(d / "bpe_vocab.gguf"), "llama")
    tokens = ["<|endoftext|>", "<|im_start|>", "h", "e", "l", "o", "\u0120", "he", "ll", "hell", "hello", "\u0120h"]
    w.add_key_value("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.pre", "smollm", GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.token_type", [3, 3] + [1] * (len(tokens) - 2), GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.INT32)
    w.add_key_value("tokenizer.ggml.merges", ["h e", "l l", "he ll", "hell o", "\u0120 h"], GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.eos_token_id", 0, GGUFValueType.UINT32)
    w.add_key_value("tokenizer.ggml.add_bos_token", False, GGUFValueType.BOOL)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (d / "spm_vocab.gguf").write_bytes((OUT / "spm.gguf").read_bytes())


def write_tokenizer_seeds() -> None:
    """First byte: bit 0 picks the vocabulary (0 byte-level BPE, 1 SentencePiece), bits 1-2 the
    operation (0/1 encode, 1 parsing special tokens; 2/3 decode), bits 3-4 flags
    (tests/fuzz/fuzz_tokenizer.cpp)."""
    d = CORPUS / "tokenizer"
    d.mkdir(parents=True, exist_ok=True)
    texts = [
        "Hello world! It's 2024, isn't it?",
        "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n<|im_start|>assistant\n",
        "      Version 2.0, January 2004\n\n\t tabs   and   spaces  ",
        "caf\u00e9 \u4f60\u597d \U0001f642 \u03a9mega \u01c5 \u0646\u0635",
    ]
    seeds = {}
    for k, text in enumerate(texts):
        for vocab in (0, 1):
            seeds[f"encode_{k}_{vocab}"] = bytes([vocab | (2 if k == 1 else 0)]) + text.encode()
    seeds["encode_invalid_utf8"] = bytes([0]) + b"ab\xc3(\xff\xfe\xe2\x82 \xf0\x9f\x99"
    seeds["encode_invalid_utf8_spm"] = bytes([1]) + b"ab\xc3(\xff\xfe\xe2\x82 \xf0\x9f\x99"
    ids = [1, 2, 9906, 1917, 0, 49151, 300, 17, 216]
    seeds["decode_bpe"] = bytes([4 | 8]) + struct.pack(f"<{len(ids)}I", *ids)
    seeds["decode_spm"] = bytes([5]) + struct.pack(f"<{len(ids)}I", *ids)
    seeds["decode_raw"] = bytes([6 | 8]) + struct.pack("<4i", 5, -1, 1 << 30, 7)
    for name, data in seeds.items():
        (d / name).write_bytes(data)


def write_sampler_seeds() -> None:
    """Byte strings read by FuzzedDataProvider (tests/fuzz/fuzz_sampler.cpp): any bytes are valid."""
    d = CORPUS / "sampler"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20)
    for k in range(6):
        (d / f"random_{k}").write_bytes(rng.integers(0, 256, size=64 + 96 * k, dtype=np.uint8).tobytes())
    (d / "zeros").write_bytes(bytes(200))


def main() -> None:
    model = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else (
        pathlib.Path.home() / ".cache" / "ember-tests" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    OUT.mkdir(parents=True, exist_ok=True)
    write_smollm2(model)
    write_spm()
    write_gguf_seeds()
    write_tokenizer_seeds()
    write_sampler_seeds()


if __name__ == "__main__":
    main()
