"""SentencePiece Unigram (tokenizer.ggml.model "t5", XLM-RoBERTa's as bge-m3 and bge-reranker-v2-m3 use it):
ember's ids equal transformers' XLM-RoBERTa tokenizer ids on 320 texts (NFKC charsmap, accents, CJK, controls,
runs of unknown characters, whitespace runs) and 40 pairs, converted by ember-convert's vocab writer
(references: tools/gen_unigram_references.py); keys and defaults; a malformed charsmap."""
import copy
import json
import pathlib

import pytest

gguf = pytest.importorskip("gguf")

from ember import _ember  # noqa: E402
from ember.convert_vocab import load_vocab  # noqa: E402
from ember.rerank import encode_pair  # noqa: E402
from test_tokenizer_wordpiece import write_vocab_gguf  # noqa: E402

REF = pathlib.Path(__file__).resolve().parent / "reference" / "unigram"


@pytest.fixture(scope="module")
def encodings():
    with open(REF / "encodings.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def vocab(encodings):
    return load_vocab(str(REF), {"vocab_size": encodings["vocab_size"]})


@pytest.fixture(scope="module")
def tok(vocab, tmp_path_factory):
    return _ember.Tokenizer.from_gguf_file(write_vocab_gguf(tmp_path_factory.mktemp("ugm") / "t.gguf", vocab))


def test_ids_equal_transformers(tok, encodings):
    bad = []
    for text, want, plain in zip(encodings["texts"], encodings["ids"], encodings["ids_plain"]):
        got = list(tok.encode(text.encode("utf-8"), True, True))
        if got != want or list(tok.encode(text.encode("utf-8"), False, True)) != plain:
            bad.append((text, got, want))
    assert not bad, f"{len(bad)} of {len(encodings['texts'])} differ, first: {bad[0]}"


def test_pairs_equal_transformers(tok, encodings):
    for (a, b), want in zip(encodings["pairs"], encodings["pair_ids"]):
        assert encode_pair(tok, a, b) == (want, [0] * len(want)), (a, b)


def test_keys_and_decode(tok, vocab, tmp_path):
    assert vocab.model == "t5" and vocab.charsmap and vocab.add_space_prefix and vocab.remove_extra_whitespaces
    assert (tok.model, tok.bos, tok.eos, tok.sep, tok.add_sep) == ("t5", 0, 2, 2, True)
    r = gguf.GGUFReader(write_vocab_gguf(tmp_path / "t.gguf", vocab))
    assert r.fields["tokenizer.ggml.model"].contents() == "t5"
    assert bytes(r.fields["tokenizer.ggml.precompiled_charsmap"].contents()) == vocab.charsmap
    ids = list(tok.encode("the quick brown fox".encode(), False, False))
    assert bytes(tok.decode(ids, False)).decode() == "the quick brown fox"
    # NFKC through the charsmap: the ligature and the full-width letters become plain ones.
    assert list(tok.encode("ﬁne ＡＢ".encode(), False, False)) == list(tok.encode(b"fine AB", False, False))
    # Without the charsmap nothing is folded.
    vocab = copy.copy(vocab)
    vocab.charsmap = None
    plain = _ember.Tokenizer.from_gguf_file(write_vocab_gguf(tmp_path / "plain.gguf", vocab))
    assert list(plain.encode("ﬁne".encode(), False, False)) != list(tok.encode("ﬁne".encode(), False, False))


def test_bad_vocabularies(vocab, tmp_path):
    base = dict(model="t5", tokens=["<pad>", "</s>", "<unk>", "\u2581a", "b"], token_types=[3, 3, 2, 1, 1],
                scores=[0.0, 0.0, 0.0, -1.0, -2.0], eos=1, unk=2)
    t = _ember.Tokenizer.from_vocab(**base)
    # No prefix space by default: "a" alone is no piece; "▁c" is one unknown run.
    assert list(t.encode(b"ab c", False, False)) == [2, 4, 2]
    with pytest.raises(ValueError, match="needs an unknown token"):
        _ember.Tokenizer.from_vocab(**{**base, "unk": -1})
    vocab = copy.copy(vocab)
    vocab.charsmap = b"\x10\x00\x00\x00\x01"   # says 16 bytes of double array, holds 1
    with pytest.raises(ValueError, match="does not fit"):
        _ember.Tokenizer.from_gguf_file(write_vocab_gguf(tmp_path / "bad.gguf", vocab))
