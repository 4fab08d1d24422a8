"""Writes tests/reference/wordpiece: three small WordPiece tokenizers trained with `tokenizers` (uncased,
cased, and lowercased with accents kept), saved by transformers' BertTokenizerFast, and the ids and token
types that tokenizer gives for a few hundred texts (Unicode, accents, CJK, controls, long words) and text
pairs. tests/test_tokenizer_wordpiece.py compares ember's WordPiece with these; it needs neither package.
Run with the HF packages: python tools/gen_wordpiece_references.py
"""
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "reference" / "wordpiece"

# name -> (lowercase, strip_accents)
VARIANTS = {"uncased": (True, None), "cased": (False, False), "lower-accents": (True, False)}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "A café in Zürich serves crème brûlée and naïve piñatas.",
    "Ångström units measure wavelengths; İstanbul and Straße are spelled with care.",
    "Tokenizers split words into pieces: un-believ-able, re-tokenize, pre-trained.",
    "Embedding models map sentences to vectors, and rerankers score query-document pairs.",
    "El niño comió paella en Málaga. São Paulo é uma cidade enorme. Ça va très bien, merci!",
    "Ελληνικά γράμματα: Αθήνα, Θεσσαλονίκη. Русский текст: Москва, Санкт-Петербург.",
    "日本語のテキストと中文文本，还有한국어 문장도 있습니다.",
    "Numbers 12345 and 3.14159, dates 2024-01-31, $100 & 50%.",
    "Emoji 😀 and symbols ™ © ® § ¶ † ‡ • … ‰ ′ ″ are rare.", "Mixed CASE Words Like iPhone, eBay, McDonald's.",
    "the the the and and of of to to in in is is it it that that", "running runner runs ran jumping jumped jumps",
]

WORDS = ("the quick brown fox café naïve résumé Zürich Ångström İstanbul Straße ÉCOLE Œuvre façade coöperate "
         "ﬁnance ﬂower Ⅻ ½ x² H₂O ǅemal Ǆ Σίσυφος ΣΑΣ Москва ЁЛКА 東京 北京 서울 한국어 ภาษาไทย العربية עברית "
         "हिन्दी ñandú güero Bjørk Łódź Dvořák Ærø ﬀ µ K Å ß ẞ İ ı ŉ ǰ ΐ ﬃ tokenizer embedding rerank "
         "unbelievable re-tokenize pre_trained e-mail don't it's U.S.A. 3.14 1,000 #hash @user a+b=c <tag> "
         "“quoted” «guillemets» ‘single’ — – ‐ … ¿qué? ¡sí! 。、「」 ·").split()
ODD = ["", " ", "\t\n\r", "a\u0000b", "a\ufffdb", "zero\u200bwidth", "soft\u00adhyphen", "nb\u00a0sp",
       "ideographic\u3000space", "e\u0301 vs é", "A\u030a vs Å", "combining\u0323\u0301 marks", "\u0085next line",
       "x" * 99, "y" * 100, "z" * 101, "abc" * 40, "unknown☃snowman", "privateuse", "mixed\u0007bell",
       "[CLS] inside text [SEP]", "[MASK] token", "tab\tseparated\tvalues", "line\nbreaks\nhere",
       "  leading and trailing  ", "ǅ Ǆ ǆ", "ﬁ ﬂ ﬀ ﬃ ﬄ", "Ⅰ Ⅱ Ⅲ ⅰ ⅱ", "𝐀𝐁𝐂 𝔸𝔹ℂ", "ＦＵＬＬＷＩＤＴＨ", "가각갂 힣",
       "\U0002a700 \U0002b740 \U0002f800 ⼀ 丽", "Ｃａｆé", "ΆΈΉ ά έ ή", "İİİ", "ŉ ǰ ΐ ΰ"]


def texts():
    rng = random.Random(41)
    out = list(CORPUS) + ODD
    while len(out) < 320:
        n = rng.randint(1, 14)
        seps = [" ", " ", " ", ", ", ". ", "\t", "\n", "-", "", "  "]
        out.append("".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(n)).strip(" "))
    return out


def train(lowercase, strip_accents):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=strip_accents)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(CORPUS * 4 + WORDS * 3, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def main() -> None:
    from transformers import BertTokenizerFast
    all_texts = texts()
    rng = random.Random(7)
    pairs = [(rng.choice(all_texts[:60]), rng.choice(all_texts)) for _ in range(40)]
    out = {"texts": all_texts, "pairs": pairs}
    for name, (lowercase, strip) in VARIANTS.items():
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        hf = BertTokenizerFast(tokenizer_object=train(lowercase, strip), unk_token="[UNK]", sep_token="[SEP]",
                               pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]", do_lower_case=lowercase)
        hf.save_pretrained(str(d))
        out[name] = {
            "ids": [hf(t)["input_ids"] for t in all_texts],
            "ids_plain": [hf(t, add_special_tokens=False)["input_ids"] for t in all_texts],
            "pair_ids": [hf(a, b)["input_ids"] for a, b in pairs],
            "pair_types": [hf(a, b)["token_type_ids"] for a, b in pairs],
            "vocab_size": len(hf),
        }
    with open(OUT / "encodings.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
