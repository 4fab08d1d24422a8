"""Mistral's tekken pre-tokenizer (tokenizer.ggml.pre = "tekken") and gpt-4o's (Phi-4-mini, Llama 4):
byte-level BPEs trained with their split regexes give HF `tokenizers`' ids on a few hundred texts
(tests/reference/tekken, written by tools/gen_tekken_references.py); ember-convert names the regexes;
a pre-tokenizer ember does not know is refused by name."""
import json
import pathlib

import pytest

from ember import _ember
from ember.convert_error import ConvertError
from ember.convert_vocab import identify_pre

REFERENCE = pathlib.Path(__file__).resolve().parent / "reference" / "tekken"


def _load(prefix, pre):
    tj = json.loads((REFERENCE / f"{prefix}tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return tj, _ember.Tokenizer.from_vocab("gpt2", tokens, merges=merges, pre=pre)


@pytest.fixture(scope="module")
def tekken():
    return _load("", "tekken")


@pytest.mark.parametrize("prefix,pre", [("", "tekken"), ("gpt-4o.", "gpt-4o"), ("gpt-4o.", "llama4")])
def test_matches_hf_tokenizers(prefix, pre):
    _, tok = _load(prefix, pre)
    rows = json.loads((REFERENCE / f"{prefix}encodings.json").read_text(encoding="utf-8"))
    assert len(rows) >= 300
    bad = [r["text"] for r in rows if tok.encode(r["text"]) != r["ids"]]
    assert not bad, f"{len(bad)} of {len(rows)} texts differ, e.g. {bad[:3]!r}"
    for r in rows:
        assert tok.decode(r["ids"]) == r["text"].encode()


@pytest.mark.parametrize("text,words", [
    ("HeLLo", ["He", "LLo"]),             # U*L+ stops at the upper run that follows
    ("XMLHttpRequest", ["XMLHttp", "Request"]),
    ("ǅemal", ["ǅemal"]),                  # titlecase is upper-class
    (" naïve", [" naïve"]),               # one leading non-letter joins the word
    ("2024", ["2", "0", "2", "4"]),       # digits one at a time
    ("a/b/c", ["a", "/b", "/c"]),
    ("x //\n", ["x", " //\n"]),           # punctuation takes trailing newlines and slashes
    ("e\u0301t\u00e9", ["e\u0301t\u00e9"]),   # combining marks are in both letter classes
])
def test_tekken_word_boundaries(tekken, text, words):
    tj, tok = tekken
    from_id = {v: k for k, v in tj["model"]["vocab"].items()}
    ids = tok.encode(text)
    assert b"".join(tok.token_to_piece(i) for i in ids) == text.encode()
    # Each word's tokens concatenate to the word: no token crosses a boundary.
    pieces, at = [tok.token_to_piece(i) for i in ids], 0
    for w in words:
        got = b""
        while len(got) < len(w.encode()):
            got += pieces[at]
            at += 1
        assert got == w.encode(), (text, w, [from_id.get(i) for i in ids])


def test_convert_names_the_regexes(tekken):
    tj, _ = tekken
    assert identify_pre(tj) == "tekken"
    assert identify_pre(_load("gpt-4o.", "gpt-4o")[0]) == "gpt-4o"


def test_gpt4o_keeps_contractions_and_digit_triples():
    tj, tok = _load("gpt-4o.", "gpt-4o")
    pieces = [tok.token_to_piece(i) for i in tok.encode("DON'T 1234567")]
    assert b"".join(pieces) == b"DON'T 1234567"
    # Words "DON'T" (a letter run with its contraction), " ", "123", "456", "7": every word boundary
    # is a token boundary.
    ends, at = set(), 0
    for p in pieces:
        at += len(p)
        ends.add(at)
    assert {5, 6, 9, 12, 13} <= ends, pieces


def test_unknown_pre_tokenizer_is_refused_by_name():
    tokens = [chr(c) for c in range(33, 127)]
    with pytest.raises(ValueError, match="unknown pre-tokenizer 'deepseek-coder' \\(tokenizer.ggml.pre\\); "
                                         "ember splits text as: .*tekken"):
        _ember.Tokenizer.from_vocab("gpt2", tokens, merges=[], pre="deepseek-coder")


def test_unrecognised_split_regex_is_refused_by_convert(tekken):
    tj, _ = tekken
    changed = json.loads(json.dumps(tj))
    changed["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}{1,2}|\s+"
    with pytest.raises(ConvertError, match="unrecognised pre-tokenizer"):
        identify_pre(changed)
