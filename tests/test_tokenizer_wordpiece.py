"""WordPiece (tokenizer.ggml.model "bert"): ember's ids equal transformers' BertTokenizerFast ids on 320 texts
(accents, CJK, Hangul, controls, long words, pairs with token types) for uncased, cased and lowercased-with-
accents tokenizers, converted by ember-convert's vocab writer (references: tools/gen_wordpiece_references.py);
llama.cpp's keys and defaults; decoding; bad vocabularies."""
import json
import pathlib

import pytest

gguf = pytest.importorskip("gguf")

from ember import _ember  # noqa: E402
from ember.convert_vocab import add_vocab, load_vocab  # noqa: E402
from ember.rerank import encode_pair  # noqa: E402

REF = pathlib.Path(__file__).resolve().parent / "reference" / "wordpiece"
VARIANTS = ("uncased", "cased", "lower-accents")


@pytest.fixture(scope="module")
def encodings():
    with open(REF / "encodings.json", encoding="utf-8") as f:
        return json.load(f)


def write_vocab_gguf(path, vocab, extra=None):
    """A GGUF holding only the tokenizer keys of vocab (and extra {key: bool | int} keys)."""
    w = gguf.GGUFWriter(str(path), arch="bert")
    add_vocab(w, vocab)
    for key, value in (extra or {}).items():
        (w.add_bool if isinstance(value, bool) else w.add_uint32)(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def tokenizers(encodings, tmp_path_factory):
    out = {}
    for name in VARIANTS:
        vocab = load_vocab(str(REF / name), {"vocab_size": encodings[name]["vocab_size"]})
        path = write_vocab_gguf(tmp_path_factory.mktemp(name) / "tok.gguf", vocab)
        out[name] = _ember.Tokenizer.from_gguf_file(path)
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_ids_equal_transformers(tokenizers, encodings, name):
    tok, ref = tokenizers[name], encodings[name]
    bad = []
    for text, want, plain in zip(encodings["texts"], ref["ids"], ref["ids_plain"]):
        got = list(tok.encode(text.encode("utf-8"), True, True))
        if got != want or list(tok.encode(text.encode("utf-8"), False, True)) != plain:
            bad.append((text, got, want))
    assert not bad, f"{len(bad)} of {len(encodings['texts'])} differ, first: {bad[0]}"


@pytest.mark.parametrize("name", VARIANTS)
def test_pairs_equal_transformers(tokenizers, encodings, name):
    tok, ref = tokenizers[name], encodings[name]
    for (a, b), ids, types in zip(encodings["pairs"], ref["pair_ids"], ref["pair_types"]):
        assert encode_pair(tok, a, b) == (ids, types), (a, b)


def test_keys_as_llama_cpp_writes_them(tokenizers, encodings, tmp_path):
    tok = tokenizers["uncased"]
    vocab = load_vocab(str(REF / "uncased"), {"vocab_size": encodings["uncased"]["vocab_size"]})
    assert vocab.model == "bert" and vocab.lowercase and vocab.strip_accents and vocab.add_sep
    assert not vocab.add_eos and vocab.add_bos
    # Phantom-space form: word starts carry U+2581, "##" continuations lose it, specials stay.
    assert vocab.tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert any(t.startswith("\u2581") for t in vocab.tokens) and not any(t.startswith("##") for t in vocab.tokens)
    assert (tok.bos, tok.sep, tok.add_sep, tok.eos) == (2, 3, True, -1)
    r = gguf.GGUFReader(write_vocab_gguf(tmp_path / "t.gguf", vocab))
    assert r.fields["tokenizer.ggml.model"].contents() == "bert"
    assert r.fields["tokenizer.ggml.seperator_token_id"].contents() == 3
    assert r.fields["tokenizer.ggml.normalizer.lowercase"].contents() is True
    # The cased file says so, and without the keys a "bert" vocab lowercases (llama.cpp's default).
    cased = load_vocab(str(REF / "cased"), {"vocab_size": encodings["cased"]["vocab_size"]})
    assert (cased.lowercase, cased.strip_accents) == (False, False)
    cased.lowercase = cased.strip_accents = None
    bare = _ember.Tokenizer.from_gguf_file(write_vocab_gguf(tmp_path / "bare.gguf", cased))
    hello = list(bare.encode("HELLO".encode(), False, False))
    assert hello == list(tokenizers["cased"].encode(b"hello", False, False))


def test_decode(tokenizers):
    tok = tokenizers["uncased"]
    ids = list(tok.encode("The quick brown fox, unbelievable!".encode(), True, False))
    assert bytes(tok.decode(ids[1:-1], False)).decode() == "the quick brown fox , unbelievable !"
    assert bytes(tok.token_to_piece(ids[0], True)) == b"[CLS]" and bytes(tok.token_to_piece(ids[0], False)) == b""


def test_long_and_unknown_words(tokenizers):
    tok = tokenizers["uncased"]
    unk = 1
    assert list(tok.encode(("q" * 101).encode(), False, False)) == [unk]   # past 100 characters: one [UNK]
    assert unk not in list(tok.encode(("the" * 33).encode(), False, False))
    assert list(tok.encode("☃".encode(), False, False)) == [unk]
    assert list(tok.encode(b"\xff\xfe", False, False)) == []   # malformed bytes are dropped as U+FFFD is
    assert list(tok.encode(b"", True, False)) == [2, 3]


def _vocab(**kw):
    base = dict(model="bert", tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581a", "b"],
                token_types=[3, 3, 3, 3, 1, 1], bos=2, unk=1, sep=3)
    base.update(kw)
    return _ember.Tokenizer.from_vocab(**base)


def test_from_vocab_and_bad_vocabularies():
    tok = _vocab()
    assert list(tok.encode(b"ab A", True, False)) == [2, 4, 5, 4, 3]
    assert list(_vocab(lowercase=False).encode(b"A", False, False)) == [1]
    with pytest.raises(ValueError, match="separator id 9"):
        _vocab(sep=9)
    with pytest.raises(ValueError, match="add_sep_token is set but there is no seperator_token_id"):
        _vocab(sep=-1)
    with pytest.raises(ValueError, match="'bert'"):
        _vocab(model="wordpiece")
