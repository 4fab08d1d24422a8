"""Tokenizer tests: SmolLM2 (byte-level BPE, pre 'smollm') against llama.cpp's reference ids, the
other pre-tokenizers against HF `tokenizers`, SentencePiece-style against the `sentencepiece`
package on a model trained here, and UTF-8 safe incremental detokenization."""
import io
import os
import random
import subprocess
import sys

import pytest

from conftest import REFERENCE, ROOT, read_jsonl
from ember import _ember

Tokenizer = _ember.Tokenizer
IncrementalDetokenizer = _ember.IncrementalDetokenizer


def fresh_rng():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")
    return random.Random(seed), seed


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return Tokenizer.from_gguf_file(smollm2_path)


@pytest.fixture(scope="module")
def smol_vocab(smollm2_path):
    """The tokenizer.* lists of the SmolLM2 file, read by the `gguf` package (an independent reader)."""
    from gguf import GGUFReader

    r = GGUFReader(smollm2_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0].item()

    types = r.fields["tokenizer.ggml.token_type"]
    return {
        "tokens": strings("tokenizer.ggml.tokens"),
        "merges": strings("tokenizer.ggml.merges"),
        "token_types": [int(types.parts[i][0]) for i in types.data],
        "model": bytes(r.fields["tokenizer.ggml.model"].parts[-1]).decode(),
        "pre": bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode(),
        "bos": scalar("tokenizer.ggml.bos_token_id"),
        "eos": scalar("tokenizer.ggml.eos_token_id"),
        "unk": scalar("tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(scalar("tokenizer.ggml.add_bos_token")),
    }


# ---------------------------------------------------------------- SmolLM2 vs llama.cpp


def test_smollm2_properties(smol):
    assert smol.n_vocab == 49152
    assert (smol.bos, smol.eos, smol.add_bos) == (1, 2, False)
    assert smol.is_eog(2) and smol.is_eog(0)      # <|im_end|> (eos), <|endoftext|>
    assert not smol.is_eog(1) and not smol.is_eog(4093)
    assert smol.encode("hello", add_bos=True) == smol.encode("hello")   # the model asks for no BOS


def test_smollm2_matches_llama_cpp(smol):
    # llama-tokenize parses special tokens by default (only the chat-markup line contains any),
    # so the reference is compared with special=True; without it, every other line is the same.
    rows = read_jsonl("tokenize.jsonl")
    assert len(rows) == 140
    for row in rows:
        assert smol.encode(row["text"], special=True) == row["ids"], row["text"]
        if "<|" not in row["text"]:
            assert smol.encode(row["text"]) == row["ids"], row["text"]
        assert smol.encode(row["text"].encode("utf-8"), special=True) == row["ids"]


def test_smollm2_roundtrip(smol):
    for row in read_jsonl("tokenize.jsonl"):
        text = row["text"].encode("utf-8")
        assert smol.decode(smol.encode(text)) == text
        assert smol.decode(row["ids"], special=True) == text
    license_text = (REFERENCE / "apache-2.0.txt").read_bytes()
    assert smol.decode(smol.encode(license_text)) == license_text


def test_from_vocab_equals_from_gguf(smol, smol_vocab):
    v = smol_vocab
    tok = Tokenizer.from_vocab(v["model"], v["tokens"], token_types=v["token_types"], merges=v["merges"],
                               pre=v["pre"], bos=v["bos"], eos=v["eos"], unk=v["unk"], add_bos=v["add_bos"])
    assert tok.n_vocab == smol.n_vocab
    license_text = (REFERENCE / "apache-2.0.txt").read_text()
    assert tok.encode(license_text) == smol.encode(license_text)
    for row in read_jsonl("tokenize.jsonl"):
        assert tok.encode(row["text"], special=True) == row["ids"]


def test_special_tokens(smol):
    ids = smol.encode("<|im_start|>user\nhi<|im_end|>", special=True)
    assert ids == [1, 4093, 198, 6004, 2]
    plain = smol.encode("<|im_start|>user\nhi<|im_end|>")
    assert 1 not in plain and 2 not in plain
    assert smol.decode(plain) == b"<|im_start|>user\nhi<|im_end|>"
    # Control tokens print only when asked to.
    assert smol.token_to_piece(1) == b""
    assert smol.token_to_piece(1, special=True) == b"<|im_start|>"
    assert smol.decode(ids) == b"user\nhi"
    assert smol.decode(ids, special=True) == b"<|im_start|>user\nhi<|im_end|>"
    # Adjacent specials and text around them.
    ids = smol.encode("a<|im_end|><|im_start|>b<|endoftext|>", special=True)
    assert ids == smol.encode("a") + [2, 1] + smol.encode("b") + [0]
    assert smol.token_to_piece(4093) == b"user"
    assert smol.token_to_piece(216) == b" "   # 'Ġ'


def test_invalid_utf8_bpe_is_replacement_characters(smol, smol_vocab):
    # llama.cpp's unicode_cpts_from_utf8 turns each byte that does not start a well-formed sequence
    # into U+FFFD (one per byte, unlike Python's errors="replace") before the pre-tokenizer, so the
    # ids are those of the text with U+FFFD in place; that text is valid, and the HF BPE over the
    # same vocab gives its ids independently. 24211 is "ï¿½" through the byte table.
    fffd = 24211
    assert smol_vocab["tokens"][fffd].encode("utf-8") == b"\xc3\xaf\xc2\xbf\xc2\xbd"
    hf = hf_tokenizer(smol_vocab, "smollm")
    cases = [(b"\xff\xfe\xc3(abc", "\ufffd\ufffd\ufffd(abc"), (b"a\xe2\x82", "a\ufffd\ufffd"),
             (b"\x80 x", "\ufffd x"), (b"ok\xc0", "ok\ufffd"), (b"\xf8\xf0\x9f\x98\x80", "\ufffd\U0001F600")]
    for raw, replaced in cases:
        assert smol.encode(raw) == smol.encode(replaced) == hf.encode(replaced).ids, raw
    assert smol.encode(b"\xff\xfe\xc3(abc") == [fffd, fffd, fffd, 24, 25276]
    assert smol.encode(b"\xff<|endoftext|>\xfe", special=True) == [fffd, 0, fffd]


def test_bad_ids_raise(smol):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol.token_to_piece(49152)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol.decode([5, -3])
    with pytest.raises(TypeError):
        smol.encode(123)


def test_bad_vocab_raises():
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'wordpiece'"):
        Tokenizer.from_vocab("wordpiece", ["a", "b"])
    with pytest.raises(ValueError, match="tokenizer.ggml.scores"):
        Tokenizer.from_vocab("llama", ["a", "b"], scores=[0.0])
    with pytest.raises(ValueError, match="token_type"):
        Tokenizer.from_vocab("gpt2", ["a", "b"], token_types=[1, 9])
    with pytest.raises(ValueError, match="merges"):
        Tokenizer.from_vocab("gpt2", ["a", "b", "ab"], merges=["ab"])
    with pytest.raises(ValueError, match="eos id 7"):
        Tokenizer.from_vocab("gpt2", ["a", "b"], eos=7)
    with pytest.raises(ValueError, match="tokenizer.ggml.tokens is empty"):
        Tokenizer.from_vocab("gpt2", [])


def test_bad_gguf_file_raises(tmp_path):
    p = tmp_path / "nope.gguf"
    p.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(ValueError):
        Tokenizer.from_gguf_file(str(p))


def gpt2_byte_chars():
    """GPT-2's byte -> printable character map (printable Latin-1 bytes stay, others move to U+0100+)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


# Merge steps chosen so that each pre-tokenizer's word boundaries show in the ids.
SYNTH_MERGES = ["Ġ 4", "1 2", "12 3", "4 5", "45 6", "Ġ ("]
SYNTH_EXPECTED = {
    "gpt-2": ["a", "Ġ4", "2", "Ġ(", "x", ")", "Ġ", "123", "456", "7"],
    "smollm": ["a", "Ġ", "4", "2", "Ġ(", "x", ")", "Ġ", "1", "2", "3", "4", "5", "6", "7"],
    "llama-bpe": ["a", "Ġ", "4", "2", "Ġ(", "x", ")", "Ġ", "123", "456", "7"],
    "qwen2": ["a", "Ġ", "4", "2", "Ġ(", "x", ")", "Ġ", "1", "2", "3", "4", "5", "6", "7"],
    "default": ["a", "Ġ", "4", "2", "Ġ", "(", "x", ")", "Ġ", "123", "456", "7"],
    "tekken": ["a", "Ġ", "4", "2", "Ġ(", "x", ")", "Ġ", "1", "2", "3", "4", "5", "6", "7"],
}


@pytest.mark.parametrize("pre", sorted(SYNTH_EXPECTED))
def test_pre_tokenizer_word_boundaries(pre):
    # Derived by hand from each regex chain on "a 42 (x) 1234567" (unknown names are refused).
    tokens = gpt2_byte_chars() + [m.replace(" ", "") for m in SYNTH_MERGES]
    tok = Tokenizer.from_vocab("gpt2", tokens, merges=SYNTH_MERGES, pre=pre)
    text = "a 42 (x) 1234567"
    assert [tok.token_text(i).decode() for i in tok.encode(text)] == SYNTH_EXPECTED[pre]
    assert tok.decode(tok.encode(text)) == text.encode()


# ---------------------------------------------------------------- incremental detokenization


def random_multibyte_text(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz ",
        "你好世界这是一个测试中文字符",
        "日本語のテキストですカタカナ",
        "Привет мир ёжик",
        "🙂🚀👍🏽❤️🎉🤖👨‍👩‍👧",
        "naïve café résumé ø ŋ ʃ",
        "0123456789 .,;!?\n",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def check_incremental(tok, ids, expected: bytes):
    detok = IncrementalDetokenizer(tok)
    out = []
    for i in ids:
        chunk = detok.push(i)
        chunk.decode("utf-8")   # never a split character
        out.append(chunk)
    tail = detok.flush()
    assert tail == b""
    assert b"".join(out) == expected


def test_incremental_detokenizer_multibyte(smol):
    rng, seed = fresh_rng()
    texts = [row["text"] for row in read_jsonl("tokenize.jsonl")]
    texts += [random_multibyte_text(rng, rng.randint(1, 80)) for _ in range(200)]
    split_seen = False
    for text in texts:
        ids = smol.encode(text)
        pieces = [smol.token_to_piece(i) for i in ids]
        split_seen |= any(not _is_utf8(p) for p in pieces)
        check_incremental(smol, ids, text.encode("utf-8"))
    assert split_seen, f"seed {seed}: no token split a character; the test would prove nothing"


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_incremental_detokenizer_holds_and_flushes(smol, smol_vocab):
    # Byte tokens for the 4 bytes of U+1F600, pushed one at a time (looked up by their byte-table
    # text: encoding a lone \xf0 gives U+FFFD, as in llama.cpp).
    chars = gpt2_byte_chars()
    byte_ids = [smol_vocab["tokens"].index(chars[b]) for b in "😀".encode("utf-8")]
    detok = IncrementalDetokenizer(smol)
    assert [detok.push(i) for i in byte_ids] == [b"", b"", b"", "😀".encode()]
    detok.push(byte_ids[0])
    detok.push(byte_ids[1])
    assert detok.flush() == "😀".encode()[:2]   # an incomplete character comes out on flush
    assert detok.flush() == b""
    # Control tokens: empty unless special.
    assert IncrementalDetokenizer(smol).push(2) == b""
    assert IncrementalDetokenizer(smol, special=True).push(2) == b"<|im_end|>"


def test_incremental_detokenizer_keeps_tokenizer_alive(smollm2_path):
    tok = Tokenizer.from_gguf_file(smollm2_path)
    ids = tok.encode("über 🙂")
    detok = IncrementalDetokenizer(tok)
    del tok
    import gc

    gc.collect()
    assert b"".join(detok.push(i) for i in ids) + detok.flush() == "über 🙂".encode()


# ---------------------------------------------------------------- other pre-tokenizers vs HF


GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_tokenizer(vocab, pre):
    """An HF `tokenizers` BPE over the SmolLM2 vocab with the pre-tokenizer from each model's
    tokenizer.json (Split regex + ByteLevel without its own regex; SmolLM2: Digits + ByteLevel)."""
    tokenizers = pytest.importorskip("tokenizers", reason="HF tokenizers is needed for this comparison")
    from tokenizers import Regex, models, pre_tokenizers

    vocab_map = {t: i for i, t in enumerate(vocab["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in vocab["merges"]]
    model = models.BPE(vocab=vocab_map, merges=merges, ignore_merges=(pre == "llama-bpe"))
    tok = tokenizers.Tokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        seq = [pre_tokenizers.Digits(individual_digits=True),
               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    else:
        regex = {"gpt-2": GPT2_RE, "llama-bpe": LLAMA3_RE, "qwen2": QWEN2_RE}[pre]
        seq = [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False), byte_level]
    tok.pre_tokenizer = pre_tokenizers.Sequence(seq)
    return tok


def random_pretok_text(rng, n):
    parts = ["the", "The", "HELLO", "don't", "DON'T", "we'll", "I'M", "it's", "'s", "'re", "'LL",
             "1", "12", "123", "1234", "12345678", "3.14159", "2024-10-01", "x1y22z333",
             " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "  \n", "\u00a0", "\u3000",
             "!", "...", "?!", "(a+b)", "$", "<|x|>", "#", "@@", "{}", "'", "''",
             "naïve", "café", "Привет", "мир", "你好", "世界", "日本語", "🙂", "👍🏽", "e\u0301",
             "\u200b", "٣٤٥", "²³", "Ⅻ", "x²", "ǅ", "ʰ", "مرحبا"]
    return "".join(rng.choice(parts) for _ in range(n))


@pytest.mark.parametrize("pre", ["smollm", "gpt-2", "llama-bpe", "qwen2"])
def test_pre_tokenizers_match_hf(smol_vocab, pre):
    hf = hf_tokenizer(smol_vocab, pre)
    v = smol_vocab
    ours = Tokenizer.from_vocab("gpt2", v["tokens"], token_types=v["token_types"], merges=v["merges"], pre=pre)
    rng, seed = fresh_rng()
    texts = [row["text"] for row in read_jsonl("tokenize.jsonl") if "<|" not in row["text"]]
    texts += [random_pretok_text(rng, rng.randint(1, 40)) for _ in range(400)]
    texts.append((REFERENCE / "apache-2.0.txt").read_text())
    for text in texts:
        expected = hf.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == expected, f"seed {seed} pre {pre}: {text!r}"


def test_pre_tokenizer_digit_grouping(smol_vocab):
    v = smol_vocab
    tok = {pre: Tokenizer.from_vocab("gpt2", v["tokens"], merges=v["merges"], pre=pre)
           for pre in ["smollm", "gpt-2", "llama-bpe", "qwen2"]}
    pieces = lambda pre, text: [tok[pre].token_to_piece(i) for i in tok[pre].encode(text)]
    # qwen2 and smollm: one digit per word; llama-bpe: groups of up to three.
    assert pieces("qwen2", "1234567") == [b"1", b"2", b"3", b"4", b"5", b"6", b"7"]
    assert pieces("smollm", "1234567") == [b"1", b"2", b"3", b"4", b"5", b"6", b"7"]
    llama = pieces("llama-bpe", "1234567")
    assert b"".join(llama) == b"1234567" and len(llama) >= 3
    # gpt-2 keeps the space with the number: " 42" is one word.
    assert pieces("gpt-2", "a 42")[1].startswith(b" ")
    assert pieces("llama-bpe", "a 42")[1] == b" "


# ---------------------------------------------------------------- SentencePiece-style


def test_spm_hand_vocab():
    # A tiny SentencePiece-style vocab: merges go by score, unknown characters use byte tokens.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    normal = {"▁": -1.0, "h": -2.0, "e": -2.0, "l": -2.0, "o": -2.0, "w": -2.0, "r": -2.0, "d": -2.0,
              "ll": -3.0, "▁h": -4.0, "he": -3.5, "llo": -5.0, "▁he": -6.0, "▁hello": -7.0,
              "▁w": -4.0, "or": -4.5, "▁wor": -8.0, "ld": -9.0}
    scores = [0.0] * len(tokens) + list(normal.values())
    types = [2, 3, 3] + [6] * 256 + [1] * len(normal)
    tokens += list(normal)
    tok = Tokenizer.from_vocab("llama", tokens, scores=scores, token_types=types, bos=1, eos=2, unk=0)
    ids = {t: i for i, t in enumerate(tokens)}
    assert tok.add_bos
    # "▁hello": ll(-3) first, then he(-3.5) -> ▁ he ll o; ▁he(-6) -> ▁he ll o; llo(-5) happens before ▁he,
    # giving ▁ he llo, then ▁he -> ▁he llo; ▁hello is not reachable from (▁he, llo)? it is: "▁he"+"llo".
    assert tok.encode("hello") == [ids["▁hello"]]
    assert tok.encode("hello", add_bos=True) == [1, ids["▁hello"]]
    # "▁world": ▁w(-4) and or(-4.5): ▁w first -> ▁w o r l d; then or -> ▁w or l d; ▁wor -> ▁wor l d; ld -> ▁wor ld
    assert tok.encode("world") == [ids["▁wor"], ids["ld"]]
    # A character outside the vocab becomes its UTF-8 bytes.
    assert tok.encode("hé") == [ids["▁h"], 3 + 0xC3, 3 + 0xA9]
    assert tok.decode(tok.encode("hello world")) == b"hello world"
    assert tok.decode(tok.encode("hé wé")) == "hé wé".encode()
    assert tok.token_to_piece(ids["▁hello"]) == b" hello"
    assert tok.token_to_piece(3 + 0x41) == b"A"
    assert tok.token_to_piece(0) == b"" and tok.token_to_piece(0, special=True) == b"<unk>"
    # Special text: a space is added again after a special token, as SentencePiece does per piece.
    assert tok.encode("<s>hello", special=True) == [1, ids["▁hello"]]
    assert tok.encode("hello</s>", special=True) == [ids["▁hello"], 2]
    assert tok.is_eog(2) and not tok.is_eog(1)
    no_prefix = Tokenizer.from_vocab("llama", tokens, scores=scores, token_types=types, bos=1, eos=2, unk=0,
                                     add_space_prefix=False)
    assert no_prefix.encode("hello") == [ids["he"], ids["llo"]]


def test_spm_invalid_utf8():
    # llama.cpp's SentencePiece session splits by the lead byte alone (unicode_len_utf8: 0xF8..0xFF
    # count as 4 bytes, no continuation check), and a symbol that is no token goes out as <0xNN>
    # byte tokens; without byte tokens ember gives the unknown token.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "▁ab", "ab"]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -3.0, -4.0]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    tok = Tokenizer.from_vocab("llama", tokens, scores=scores, token_types=types, bos=1, eos=2, unk=0,
                               add_space_prefix=False)
    ids = {t: i for i, t in enumerate(tokens)}
    byte = lambda b: 3 + b  # noqa: E731
    assert tok.encode(b"ab\xff") == [ids["ab"], byte(0xFF)]
    assert tok.encode(b"\xffab") == [byte(0xFF), byte(ord("a")), byte(ord("b"))]        # one 3-byte symbol
    assert tok.encode(b"\xffabab") == [byte(0xFF), byte(ord("a")), byte(ord("b")), byte(ord("a")), ids["b"]]
    assert tok.encode(b"\xc3(ab") == [byte(0xC3), byte(ord("(")), ids["ab"]]
    assert tok.encode(b"\x80\x80") == [byte(0x80), byte(0x80)]
    no_bytes = Tokenizer.from_vocab("llama", tokens[:3] + tokens[259:], scores=[0.0] * 3 + scores[259:],
                                    token_types=[2, 3, 3] + types[259:], bos=1, eos=2, unk=0,
                                    add_space_prefix=False)
    ab = 7   # its id there
    assert no_bytes.encode(b"ab\x80ab") == [ab, 0, ab]
    assert no_bytes.encode(b"ab\xffab") == [ab, 0]


@pytest.fixture(scope="module")
def trained_spm():
    spm = pytest.importorskip("sentencepiece", reason="the sentencepiece package trains the reference model")
    text = (REFERENCE / "apache-2.0.txt").read_text()
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=700, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
             else 5 if sp.is_unused(i) else 1 for i in range(n)]
    tok = Tokenizer.from_vocab("llama", tokens, scores=scores, token_types=types,
                               bos=sp.bos_id(), eos=sp.eos_id(), unk=sp.unk_id())
    return sp, tok


def test_spm_matches_sentencepiece(trained_spm):
    sp, tok = trained_spm
    rng, seed = fresh_rng()
    words = (REFERENCE / "apache-2.0.txt").read_text().split()
    texts = []
    for _ in range(300):
        ws = [rng.choice(words) for _ in range(rng.randint(1, 12))]
        if rng.random() < 0.3:
            ws.insert(rng.randrange(len(ws) + 1), rng.choice(["你好", "ü", "🙂", "Ωmega", "~~", "ǅ"]))
        texts.append(" ".join(ws))
    texts += ["a  b   c", " leading", "trailing ", "\ttab\nnewline", "the 你好 License", "Ωmega~~"]
    for text in texts:
        expected = sp.encode(text)
        assert tok.encode(text) == expected, f"seed {seed}: {text!r} {sp.encode(text, out_type=str)}"
        assert tok.decode(expected) == text.encode("utf-8")
        assert tok.encode(text, add_bos=True) == [sp.bos_id()] + expected


# ---------------------------------------------------------------- generated tables


def test_unicode_tables_are_generated():
    import unicodedata

    committed = (ROOT / "src" / "tokenizer" / "unicode_tables.cpp").read_text()
    if f"Unicode {unicodedata.unidata_version})" not in committed.splitlines()[0]:
        pytest.skip(f"this Python has Unicode {unicodedata.unidata_version}; the table was generated "
                    f"with another version ({committed.splitlines()[0]})")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_unicode_tables.py")],
                         check=True, capture_output=True, text=True).stdout
    assert out == committed
