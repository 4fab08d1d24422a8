"""Gemma 4's tokenizer (tokenizer.ggml.model = "gemma4"): a byte-fallback BPE laid out as Gemma 4's
tokenizer.json, converted by ember-convert into what llama.cpp's converter writes, gives transformers'
GemmaTokenizer ids on a few hundred texts (tests/reference/gemma4_tokenizer, written by
tools/gen_gemma4_tokenizer_references.py) and decodes as it does; llama.cpp's "gemma4" pre-tokenizer name
reads the same; a tiny Gemma 4 checkpoint converted with it loads and runs; bad files and inputs give clear
errors."""
import json
import os
import pathlib
import shutil
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package writes the vocab-only file")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402

from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402
from ember.convert_vocab import add_vocab, load_vocab  # noqa: E402

REFERENCE = pathlib.Path(__file__).resolve().parent / "reference" / "gemma4_tokenizer"
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def _config(tj):
    return {"vocab_size": len(tj["model"]["vocab"]), "model_type": "gemma4_text"}


def _write(vocab, path):
    writer = gguf.GGUFWriter(str(path), "gemma4")
    add_vocab(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(tokenizer.json, the vocab-only GGUF ember-convert's tokenizer part writes, its tokenizer)."""
    tj = json.loads((REFERENCE / "tokenizer.json").read_text(encoding="utf-8"))
    path = tmp_path_factory.mktemp("gemma4_tok") / "vocab.gguf"
    _write(load_vocab(str(REFERENCE), _config(tj)), path)
    return tj, str(path), _ember.Tokenizer.from_gguf_file(str(path))


@pytest.fixture(scope="module")
def rows():
    return json.loads((REFERENCE / "encodings.json").read_text(encoding="utf-8"))


def test_file_has_llama_cpp_keys(converted):
    tj, path, tok = converted
    kv = {name: f.contents() for name, f in gguf.GGUFReader(path).fields.items()}
    assert kv["tokenizer.ggml.model"] == "gemma4" and "tokenizer.ggml.pre" not in kv
    vocab = tj["model"]["vocab"]
    tokens = kv["tokenizer.ggml.tokens"]
    assert tokens == sorted(vocab, key=vocab.get)
    assert set(kv["tokenizer.ggml.scores"]) == {-1000.0}
    assert kv["tokenizer.ggml.merges"] == [" ".join(m) for m in tj["model"]["merges"]]
    types = kv["tokenizer.ggml.token_type"]
    special = set(json.loads((REFERENCE / "special_ids.json").read_text()))
    visible = {"<|channel>", "<channel|>", "<|tool_response>", "<|\"|>"}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        want = (USER_DEFINED if t in visible else BYTE if t.startswith("<0x") and len(t) == 6
                else CONTROL if i in special else NORMAL)
        assert ty == want, (i, t, ty)
    # Runs of newlines, spaces and tabs are HF added tokens inside the vocab: NORMAL, as llama.cpp types them.
    assert types[tokens.index("\n\n")] == types[tokens.index("\u2581\u2581")] == NORMAL
    assert (kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.eos_token_id"], kv["tokenizer.ggml.unknown_token_id"],
            kv["tokenizer.ggml.padding_token_id"], kv["tokenizer.ggml.mask_token_id"]) == (2, 1, 3, 0, 4)
    assert kv["tokenizer.ggml.add_bos_token"] is True and kv["tokenizer.ggml.add_eos_token"] is False
    assert kv["tokenizer.ggml.add_space_prefix"] is False
    assert tok.model == "gemma4" and tok.add_bos and tok.bos == 2


def test_matches_transformers(converted, rows):
    _, _, tok = converted
    assert len(rows) >= 300
    plain = [r for r in rows if not r.get("add_bos")]
    bad = [r["text"] for r in plain if tok.encode(r["text"], special=True) != r["ids"]]
    assert not bad, f"{len(bad)} of {len(plain)} texts differ, e.g. {bad[:3]!r}"
    (with_bos,) = [r for r in rows if r.get("add_bos")]
    assert tok.encode(with_bos["text"], add_bos=True, special=True) == with_bos["ids"] and with_bos["ids"][0] == 2
    # Pieces the references reach: byte fallback, runs of newlines longer than any newline token.
    assert any(tok.token_text(i).startswith(b"<0x") for r in plain for i in r["ids"])
    assert any("\n" * 40 in r["text"] for r in plain)


def test_decodes_as_transformers(converted, rows):
    _, _, tok = converted
    for r in rows:
        if r["decoded"] is not None:
            assert tok.decode(r["ids"], special=True) == r["decoded"].encode(), r["text"]
        # Lossless but for a typed U+2581, which reads as the space it stands for.
        if "\u2581" not in r["text"]:
            assert tok.decode(tok.encode(r["text"], special=True), special=True) == r["text"].encode()


def test_streaming_decode_puts_bytes_back_together(converted):
    _, _, tok = converted
    text = "emoji 😀😃😄 and 日本語 ok"
    ids = tok.encode(text)
    assert any(tok.token_text(i).startswith(b"<0x") for i in ids)
    d = _ember.IncrementalDetokenizer(tok)
    out = b"".join(d.push(i) for i in ids) + d.flush()
    assert out == text.encode()


def test_merges_stay_inside_a_line(converted):
    """Merges run over each line and never join a newline to its neighbours; a run of newlines is the longest
    newline tokens from the left (HF's added tokens)."""
    tj, _, tok = converted
    ids = tok.encode("ab\ncd")
    pieces = [tok.token_to_piece(i) for i in ids]
    assert b"\n" in pieces, pieces
    vocab = tj["model"]["vocab"]
    assert tok.encode("\n" * 40) == [vocab["\n" * 31], vocab["\n" * 9]]


def test_gemma4_pre_tokenizer_name_reads_the_same(converted, rows):
    """llama.cpp's pre-tokenizer name "gemma4" on a "gpt2" vocab selects the same tokenizer."""
    tj, path, _ = converted
    kv = {name: f.contents() for name, f in gguf.GGUFReader(path).fields.items()}
    tok = _ember.Tokenizer.from_vocab("gpt2", kv["tokenizer.ggml.tokens"], token_types=kv["tokenizer.ggml.token_type"],
                                      merges=kv["tokenizer.ggml.merges"], pre="gemma4", bos=2, eos=1, unk=3)
    for r in rows[:120]:
        if not r.get("add_bos"):
            assert tok.encode(r["text"], special=True) == r["ids"], r["text"]
    assert tok.add_bos   # the gemma4 pre-tokenizer always adds BOS, as llama.cpp's loader does


def test_bos_is_added_whatever_the_file_says(converted, tmp_path):
    tj = json.loads((REFERENCE / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = load_vocab(str(REFERENCE), _config(tj))
    vocab.add_bos = False
    path = tmp_path / "no_bos.gguf"
    _write(vocab, path)
    tok = _ember.Tokenizer.from_gguf_file(str(path))
    assert tok.encode("hi", add_bos=True)[0] == 2


def test_end_of_turn_markers_end_generation(converted):
    tj, _, tok = converted
    vocab = tj["model"]["vocab"]
    for text in ("<eos>", "<turn|>", "<|tool_response>"):
        assert tok.is_eog(vocab[text]), text
    assert not tok.is_eog(vocab["<|turn>"])


def test_invalid_utf8_input_is_replaced(converted):
    _, _, tok = converted
    ids = tok.encode(b"a\xffb")
    assert tok.decode(ids) == "a\ufffdb".encode()


def test_ember_convert_writes_it_for_a_gemma4_checkpoint(tmp_path, rows):
    """A tiny Gemma 4 checkpoint with this tokenizer (its vocab as wide as the tokenizer) through ember-convert:
    the file's tokenizer is "gemma4", the special ids come from tokenizer_config.json before config.json's
    (as llama.cpp's converter takes them), and the loaded model tokenizes as transformers and runs."""
    spec = hf_tiny.models()["gemma4"]
    tj = json.loads((REFERENCE / "tokenizer.json").read_text(encoding="utf-8"))
    n = len(tj["model"]["vocab"])
    d = tmp_path / "gemma4"
    shutil.copytree(REFERENCE, d)
    config = dict(spec["config"], vocab_size=n, vocab_size_per_layer_input=n)
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
    rng = np.random.default_rng(0)
    weights = {k: (0.08 * rng.standard_normal((n, *v.shape[1:]))).astype(np.float32)
               if v.shape[0] == spec["config"]["vocab_size"] else v
               for k, v in hf_tiny._weights(spec, hf_tiny.REFERENCE).items()}
    hf_tiny._write_safetensors(str(d / "model.safetensors"), weights, "float32")
    out = str(tmp_path / "g4.gguf")
    convert(str(d), out, "f32", progress=False)
    kv = {name: f.contents() for name, f in gguf.GGUFReader(out).fields.items()}
    assert kv["general.architecture"] == "gemma4" and kv["tokenizer.ggml.model"] == "gemma4"
    assert (kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.eos_token_id"]) == (2, 1)   # config.json: 1, 2
    m = _ember.Model(out)
    for r in rows[:100]:
        if not r.get("add_bos"):
            assert m.tokenizer.encode(r["text"], special=True) == r["ids"], r["text"]
    ids = m.tokenizer.encode("Hello world", add_bos=True)
    logits = hf_tiny.ember_logits(out, ids)
    assert logits.shape == (len(ids), n) and np.isfinite(logits).all()


# --------------------------------------------------------------------------------------- errors


def test_unknown_tokenizer_model_is_refused_by_name():
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'gemma5' is not supported"):
        _ember.Tokenizer.from_vocab("gemma5", ["a", "b"], merges=["a b"])


def test_unknown_pre_tokenizer_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown pre-tokenizer 'gemma-4' .*gemma4"):
        _ember.Tokenizer.from_vocab("gpt2", ["a", "b", "ab"], merges=["a b"], pre="gemma-4")


def test_no_bos_token_is_refused():
    """llama.cpp adds BOS to every Gemma 4 encoding: a vocab without a BOS id cannot be read."""
    with pytest.raises(ValueError, match="add_bos_token is set but there is no bos_token_id"):
        _ember.Tokenizer.from_vocab("gemma4", ["a", "b", "ab"], merges=["a b"])


def test_malformed_merge_is_refused():
    with pytest.raises(ValueError, match=r"tokenizer.ggml.merges\[0\] = 'ab' is not 'left right'"):
        _ember.Tokenizer.from_vocab("gemma4", ["<bos>", "a", "b", "ab"], merges=["ab"], bos=0)


def test_convert_refuses_a_gemma4_tokenizer_json_of_another_kind(tmp_path):
    d = tmp_path / "tok"
    shutil.copytree(REFERENCE, d)
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tj["model"]["byte_fallback"] = False
    (d / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    with pytest.raises(ConvertError, match="a Gemma 4 tokenizer.json is a byte-fallback BPE"):
        load_vocab(str(d), _config(tj))
    assert os.path.exists(d / "tokenizer.json")
