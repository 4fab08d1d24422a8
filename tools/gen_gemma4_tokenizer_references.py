"""Writes tests/reference/gemma4_tokenizer: a small tokenizer laid out as Gemma 4's tokenizer.json (a
byte-fallback BPE over text whose spaces the normalizer makes U+2581, no word split, control tokens
first, runs of newlines, spaces and tabs as SentencePiece's user-defined pieces: non-special added tokens
inside the vocab whose merges rank first, then the 256 <0xNN> byte tokens), the tokenizer_config.json
that makes transformers load it as GemmaTokenizer, and the ids transformers gives a few hundred texts
(Unicode of many scripts, accents, whitespace and newline runs, digits, code, emoji, chat markers), so
that tests/test_tokenizer_gemma4.py compares ember with no transformers installed.

    python tools/gen_gemma4_tokenizer_references.py [--out DIR]
"""
import argparse
import json
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
import gen_tekken_references  # noqa: E402
import hf_tiny  # noqa: E402

SPACE = "\u2581"
CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|channel>", "<channel|>",
           "<|tool_response>", "<|\"|>"]
# Gemma's user-defined pieces: runs of 1-31 newlines, 2-31 spaces, 1-31 tabs.
RUNS = ["\n" * n for n in range(1, 32)] + [SPACE * n for n in range(2, 32)] + ["\t" * n for n in range(1, 32)]
BYTES = [f"<0x{b:02X}>" for b in range(256)]

PARTS = gen_tekken_references.PARTS + [
    "\n\n\n", "\n" * 40, "  \n\n  ", "\t\t", "\t\tx", "x\t\t\ty", " " * 8, " " * 40, "a    b", "\u2581", "▁▁x",
    "<|turn>user\n", "<turn|>", "<|channel>thought<channel|>", "<|tool_response>", "<|\"|>", "<bos>", "<0x41>",
    "日本語のテキスト", "😀😃😄", "🧑‍💻", "ﷺ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ꙃ", "\u0000", "\x7f", "\ufeff", "e\u0301\u0301",
]


def texts():
    rng = random.Random(4)
    out = list(hf_tiny.TEST_TEXTS)
    out += [rng.choice(PARTS) for _ in range(60)]
    out += ["".join(rng.choice(PARTS) for _ in range(rng.randint(2, 30))) for _ in range(300)]
    out += ["", " ", "\n", " leading space", "trailing space ", "x" * 300, "ab " * 200]
    return out


def run_merges(vocab):
    """SentencePiece's extractor: each run split every way into two tokens, in the runs' order."""
    merges = []
    for run in RUNS:
        merges += [(run[:k], run[k:]) for k in range(1, len(run)) if run[:k] in vocab and run[k:] in vocab]
    return merges


def build(out):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                            trainers)

    # The learned part, as SentencePiece would: no piece crosses a space (only starts with one), a digit,
    # a newline or a tab; runs of these are the user-defined pieces above.
    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.normalizer = normalizers.Replace(" ", SPACE)
    learner.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("[\n\t]+"), behavior="isolated"),
        pre_tokenizers.Split(SPACE, behavior="merged_with_next"),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    corpus = [line for _ in range(10) for line in hf_tiny.CORPUS] + gen_tekken_references.PARTS * 3
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False, special_tokens=[])
    learner.train_from_iterator(corpus, trainer)
    learned = json.loads(learner.to_str())["model"]

    tokens = CONTROL + RUNS + BYTES
    index = {t: i for i, t in enumerate(tokens)}
    for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if t not in index and "\n" not in t and "\t" not in t:
            index[t] = len(tokens)
            tokens.append(t)
    merges = run_merges(index) + [tuple(m) for m in learned["merges"]
                                  if "".join(m) in index and "\n" not in "".join(m) and "\t" not in "".join(m)]

    tok = Tokenizer(models.BPE(vocab=index, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in RUNS])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", index["<bos>"])])
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
              "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
              "mask_token": "<mask>", "clean_up_tokenization_spaces": False,
              "extra_special_tokens": CONTROL[5:]}
    with open(out / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "reference" / "gemma4_tokenizer"))
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build(out)

    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(out))
    rows = []
    for t in texts():
        ids = hf(t, add_special_tokens=False)["input_ids"]
        rows.append({"text": t, "ids": ids, "decoded": hf.decode(ids)})
    rows.append({"text": "Hello world", "ids": hf("Hello world")["input_ids"], "decoded": None, "add_bos": True})
    with open(out / "encodings.json", "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n]\n")
    # What llama.cpp's converter (LlamaHfVocab) reads as special: CONTROL in its token types.
    with open(out / "special_ids.json", "w", encoding="utf-8") as f:
        json.dump(sorted(hf.all_special_ids), f)
        f.write("\n")


if __name__ == "__main__":
    main()
