"""Writes tests/reference/unigram: a small SentencePiece Unigram model (nmt_nfkc normalization, as XLM-RoBERTa's)
trained with `sentencepiece`, the tokenizer files transformers' XLM-RoBERTa tokenizer saves for it (the
tokenizer.json bge-m3, bge-reranker-v2-m3 and nomic-embed-text-v2 ship), and that tokenizer's ids for the texts
of tools/gen_wordpiece_references.py and for text pairs. tests/test_tokenizer_unigram.py compares ember's
Unigram tokenizer with these; it needs neither package. Run with the HF packages:
python tools/gen_unigram_references.py
"""
import io
import json
import pathlib
import random

from gen_wordpiece_references import CORPUS, WORDS, texts

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "reference" / "unigram"


def train(path: pathlib.Path) -> None:
    import sentencepiece as spm
    lines = CORPUS * 4 + [" ".join(WORDS[i:i + 7]) for i in range(0, len(WORDS), 3)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="unigram",
                                   vocab_size=500, character_coverage=0.98, normalization_rule_name="nmt_nfkc",
                                   hard_vocab_limit=False, minloglevel=2)
    path.write_bytes(model.getvalue())


def main() -> None:
    from transformers import AutoTokenizer
    OUT.mkdir(parents=True, exist_ok=True)
    spm_path = OUT / "sentencepiece.bpe.model"
    train(spm_path)
    hf = AutoTokenizer.from_pretrained(str(OUT), tokenizer_type="xlm-roberta")   # converted to tokenizer.json
    hf.save_pretrained(str(OUT))
    for extra in ("sentencepiece.bpe.model", "special_tokens_map.json"):
        (OUT / extra).unlink(missing_ok=True)
    all_texts = texts()
    rng = random.Random(7)
    pairs = [(rng.choice(all_texts[:60]), rng.choice(all_texts)) for _ in range(40)]
    out = {
        "texts": all_texts, "pairs": pairs, "vocab_size": len(hf),
        "ids": [hf(t)["input_ids"] for t in all_texts],
        "ids_plain": [hf(t, add_special_tokens=False)["input_ids"] for t in all_texts],
        "pair_ids": [hf(a, b)["input_ids"] for a, b in pairs],
    }
    with open(OUT / "encodings.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
