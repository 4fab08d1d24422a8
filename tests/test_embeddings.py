"""Embeddings: ember's hidden states after the final norm against transformers' on a tiny random
Llama (tests/reference/hf, or live with hf_live), pooled (none, mean, cls, last; the GGUF's
{arch}.pooling_type or an override) and L2-normalized as llama.cpp does; Llama.embed /
create_embedding on SmolLM2; ember-server's /v1/embeddings and its errors; embed on a Llama
without embedding=True."""
import base64

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to add a pooling key to a file")

import hf_tiny  # noqa: E402
from hf_tiny import hf_reference  # noqa: E402,F401 (a fixture)

from ember import Llama, _ember  # noqa: E402
from ember.convert import convert  # noqa: E402

TEXT = hf_tiny.EMBED_TEXT
TINY = "embed-llama"   # a random 2-layer Llama with the byte-level BPE tokenizer


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """Path of the tiny model's f32 GGUF."""
    root = tmp_path_factory.mktemp("emb")
    d = str(root / "hf")
    hf_tiny.build(TINY, d)
    path = str(root / "tiny.gguf")
    convert(d, path, "f32", progress=False)
    return path


def l2(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def close(got, want, rel=1e-4):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= rel, f"max|diff|/max|ref| = {err:.2e}"


def test_hidden_states_match_transformers(tiny_path, hf_reference):
    ids = hf_tiny.EMBED_IDS
    m = _ember.Model(tiny_path)
    # n_batch 16: the rows of three chunks, and the causal attention across them.
    ctx = _ember.Context(m, n_ctx=64, n_batch=16, n_threads=2, type_k="f32", type_v="f32", embeddings=True)
    ctx.eval(ids, logits_all=True)
    want = hf_reference.hidden(TINY, ids)
    close(ctx.all_embeddings(), want)
    close(ctx.embeddings(-1), want[-1])
    ctx.truncate(0)
    ctx.eval(ids, logits_all=False)   # the last row alone
    assert ctx.n_logits == 1
    close(ctx.embeddings(), want[-1])
    with pytest.raises(ValueError, match="embeddings, not logits"):
        ctx.logits()
    plain = _ember.Context(m, n_ctx=16)
    plain.eval(ids[:4])
    with pytest.raises(ValueError, match="embeddings=true"):
        plain.embeddings()


@pytest.mark.parametrize("pooling", ["none", "mean", "cls", "last"])
def test_pooling_matches_transformers(tiny_path, hf_reference, pooling):
    p = {"none": 0, "mean": 1, "cls": 2, "last": 3}[pooling]
    with Llama(tiny_path, n_ctx=64, n_batch=16, n_threads=2, type_k=0, type_v=0, embedding=True, pooling_type=p,
               verbose=False) as llm:
        assert llm.pooling_type() == p
        ids = llm.tokenize(TEXT.encode())
        h = hf_reference.hidden(TINY, ids)
        want = {"none": h, "mean": h.mean(axis=0), "cls": h[0], "last": h[-1]}[pooling]
        close(llm.embed(TEXT, normalize=False), want)
        got = llm.embed(TEXT)   # normalized by default
        close(got, l2(want))
        assert np.allclose(np.linalg.norm(np.asarray(got), axis=-1), 1.0, atol=1e-5)
        assert llm.n_tokens == 0   # the context is the embeddings' scratch


def _with_key(src, dst, key, value):
    """A copy of a GGUF with one uint32 key added."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            writer.add_key_value(f.name, f.contents(), f.types[0],
                                 f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    writer.add_uint32(key, value)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_pooling_from_the_file(tiny_path, hf_reference, tmp_path):
    # No {arch}.pooling_type: none, as llama.cpp resolves an unspecified pooling type.
    with Llama(tiny_path, n_ctx=64, embedding=True, verbose=False) as llm:
        assert llm.pooling_type() == 0
        ids = llm.tokenize(TEXT.encode())
        per_token = llm.embed(TEXT)
        assert len(per_token) == len(ids) and len(per_token[0]) == llm.n_embd()
    meaned = str(tmp_path / "mean.gguf")
    _with_key(tiny_path, meaned, "llama.pooling_type", 1)
    assert _ember.Model(meaned).pooling_type == 1
    with Llama(meaned, n_ctx=64, type_k=0, type_v=0, embedding=True, verbose=False) as llm:
        assert llm.pooling_type() == 1
        close(llm.embed(TEXT), l2(hf_reference.hidden(TINY, ids).mean(axis=0)))
    with Llama(meaned, n_ctx=64, embedding=True, pooling_type=3, verbose=False) as llm:
        assert llm.pooling_type() == 3   # the constructor's override wins
    with pytest.raises(ValueError, match="pooling_type"):
        Llama(tiny_path, embedding=True, pooling_type=5, verbose=False)
    with pytest.raises(ValueError, match="no rank head"):   # rank pooling needs a reranker's head
        Llama(tiny_path, embedding=True, pooling_type=4, verbose=False)


# ---- SmolLM2: llama-cpp-python's shapes ------------------------------------------------------
@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Llama(smollm2_path, n_ctx=128, n_threads=2, embedding=True, pooling_type=1, verbose=False) as llm:
        yield llm


def test_embed_shapes(smol):
    n_embd = smol.n_embd()
    one = smol.embed("Hello world")
    assert isinstance(one, list) and len(one) == n_embd and isinstance(one[0], float)
    assert abs(np.linalg.norm(one) - 1.0) < 1e-5
    many = smol.embed(["Hello world", "A longer sentence about something else entirely."])
    assert len(many) == 2 and all(len(v) == n_embd for v in many)
    assert np.allclose(many[0], one, atol=1e-6)   # alone or in a list: the same vector
    assert not np.allclose(many[0], many[1])
    raw = smol.embed("Hello world", normalize=False)
    assert np.allclose(l2(np.asarray(raw)), one, atol=1e-6)
    data, n = smol.embed(["Hello world"], return_count=True)
    assert n == len(smol.tokenize(b"Hello world"))
    # truncate: a text longer than n_ctx keeps its first n_ctx tokens.
    long = "word " * 400
    assert len(smol.embed(long)) == n_embd
    with pytest.raises(ValueError, match="exceed context window of 128"):
        smol.embed(long, truncate=False)


def test_create_embedding(smol):
    r = smol.create_embedding(["Hello world", "Bye"], model="m")
    assert r["object"] == "list" and r["model"] == "m"
    assert [d["index"] for d in r["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == smol.n_embd() for d in r["data"])
    n = len(smol.tokenize(b"Hello world")) + len(smol.tokenize(b"Bye"))
    assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert np.allclose(r["data"][0]["embedding"], smol.embed("Hello world"), atol=1e-6)
    assert smol.create_embedding("Hello world")["model"] == smol.model_path


def test_embed_needs_embedding_true(smollm2_path):
    with Llama(smollm2_path, n_ctx=64, verbose=False) as llm:
        with pytest.raises(RuntimeError, match="embedding=True"):
            llm.embed("Hello")
        with pytest.raises(RuntimeError, match="embedding=True"):
            llm.create_embedding("Hello")


def test_embedding_llama_does_not_generate(smol):
    with pytest.raises(RuntimeError, match="embedding=True"):
        smol.create_completion("Hello", max_tokens=2)


# ---- ember-server's /v1/embeddings -----------------------------------------------------------
@pytest.fixture(scope="module")
def engine(smollm2_path):
    from ember import LLM, AsyncLLMEngine
    with LLM(smollm2_path, n_ctx=128, n_threads=2, max_num_seqs=2) as llm:
        engine = AsyncLLMEngine.from_llm(llm)
        yield engine
        engine.shutdown()


def _client(engine, **settings):
    from fastapi.testclient import TestClient

    from ember.server.app import create_app
    from ember.server.args import ServerSettings
    return TestClient(create_app(engine, ServerSettings(**settings)))


def test_server_embeddings(engine, smol):
    with _client(engine, pooling="mean") as c:
        r = c.post("/v1/embeddings", json={"input": ["Hello world", "Bye"], "model": "SmolLM2-135M-Instruct.Q4_1.gguf"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert [d["index"] for d in body["data"]] == [0, 1]
        assert all(d["object"] == "embedding" for d in body["data"])
        # The server tokenizes as completions do (special tokens parsed): the same ids here.
        assert np.allclose(body["data"][0]["embedding"], smol.embed("Hello world"), atol=1e-5)
        n = len(smol.tokenize(b"Hello world")) + len(smol.tokenize(b"Bye"))
        assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
        ids = smol.tokenize(b"Hello world")
        for form in (ids, [ids]):   # token ids, or an array of them
            r = c.post("/v1/embeddings", json={"input": form})
            assert r.status_code == 200
            assert np.allclose(r.json()["data"][0]["embedding"], body["data"][0]["embedding"], atol=1e-6)
        r = c.post("/embeddings", json={"input": "Hello world", "encoding_format": "base64"})
        v = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        assert np.allclose(v, body["data"][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": 42}, "input"),
    ({"input": ["ok", {"a": 1}]}, "input"),
    ({"input": [1, 2, 10**9]}, "input"),
    ({}, "input"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "model": "gpt-4"}, "model"),
    ({"input": "word " * 200}, "input"),
])
def test_server_embedding_errors(engine, body, param):
    with _client(engine, pooling="last") as c:
        r = c.post("/v1/embeddings", json=body)
        assert 400 <= r.status_code < 500
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]


def test_server_pooling_none_is_refused(engine):
    from ember.server.args import parse_args, settings
    assert settings(parse_args(["-m", "x.gguf", "--pooling", "cls"])).pooling == "cls"
    # SmolLM2's GGUF names no pooling: per-token vectors, which OpenAI's format cannot carry.
    with _client(engine) as c:
        r = c.post("/v1/embeddings", json={"input": "Hello"})
        assert r.status_code == 400 and "--pooling" in r.json()["error"]["message"]
