"""Writes tests/reference/tekken: byte-level BPEs trained here with the split regex of Mistral's
tekken tokenizer.json (Split isolated + ByteLevel without its regex, ignore_merges, as Mistral Nemo,
Small and Ministral 3 ship it) and with gpt-4o's (gpt-4o.*, as Phi-4-mini ships it), and the ids HF
`tokenizers` gives each for a few hundred texts (Unicode
letters of every case class, marks, accents, digits of several scripts, code, whitespace), so that
tests/test_tokenizer_tekken.py compares ember's tekken pre-tokenizer with no transformers installed.

    /tmp/hfenv/bin/python tools/gen_tekken_references.py [--out DIR]
"""
import argparse
import json
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import hf_tiny  # noqa: E402

# OpenAI's gpt-4o split (llama.cpp's "gpt-4o" and "llama4": Phi-4-mini, Llama 4): tekken's with an
# optional contraction after each letter run and up to three digits together.
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION
               + r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION
               + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Pieces the random texts are made of: each case class (Lu, Ll, Lt, Lm, Lo), marks (Mn, Mc, Me),
# accents precomposed and combining, digits (Nd, Nl, No), punctuation, slashes and newlines, code.
PARTS = ["the", "The", "THE", "HeLLo", "camelCase", "snake_case", "XMLHttpRequest", "iPhone", "McDonald",
         "don't", "DON'T", "we'll", "l'été", "L'Été", "naïve", "Naïve", "NAÏVE", "café", "CAFÉ", "e\u0301",
         "E\u0301t\u00e9", "a\u0308", "\u0301", "\u0301x", "Straße", "STRASSE", "ǅemal", "ǲ", "ǈ", "ʰa", "aʰ", "ʰʰ",
         "ˈhɛloʊ", "ᵃᵇ", "Ελληνικά", "ΑΒΓ", "русский", "РУССКИЙ", "Москва", "日本語", "カタカナ", "ひらがな", "中文",
         "한국어", "हिन्दी", "नमस्ते", "தமிழ்", "עברית", "مرحبا", "١٢٣", "٣٤٥", "໑໒", "²³", "½", "Ⅻ", "ⅻ", "x²", "0",
         "7", "42", "2024", "3.14159", "1,000,000", "-17", "1e-9", "0x1F", " ", "  ", "   ", "\t", "\n", "\r\n",
         "\n\n", " \n ", "  \n", "\u00a0", "\u3000", "\u2003", "!", "...", "?!", "(a+b)", "$x", "<|x|>", "#", "@@",
         "{}", "'", "''", "/", "//", "/\n", "./bin/sh", "http://example.com/a/b", "a/b/c", "C:\\Users\\x", "->",
         "=>", "::", "// comment\n", "/* c */", "def f(x):\n    return x\n", "for (int i = 0; i < n; ++i)",
         "if x == 1:\n\tpass", "🙂", "👍🏽", "🇫🇷", "❤️", "\u200b", "\u200d", "ﬀ", "Å", "ŝ"]


def texts():
    rng = random.Random(42)
    out = list(hf_tiny.TEST_TEXTS)
    out += [rng.choice(PARTS) for _ in range(60)]
    out += ["".join(rng.choice(PARTS) for _ in range(rng.randint(2, 30))) for _ in range(300)]
    return out


def train(path, split, ignore_merges):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    corpus = [line for _ in range(10) for line in hf_tiny.CORPUS] + PARTS * 3
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return tok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "reference" / "tekken"))
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for prefix, split, ignore_merges in (("", TEKKEN_SPLIT, True), ("gpt-4o.", GPT4O_SPLIT, False)):
        tok = train(out / f"{prefix}tokenizer.json", split, ignore_merges)
        rows = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts()]
        with open(out / f"{prefix}encodings.json", "w", encoding="utf-8") as f:
            f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n]\n")


if __name__ == "__main__":
    main()
