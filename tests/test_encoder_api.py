"""The embedding and ranking APIs on encoder models (the tiny random encoders of tests/encoder_tiny.py against
transformers' outputs in tests/reference/encoders): Embedder, LLM.embed / encode / score, Llama.embed, and an
ember-server serving an encoder (/v1/embeddings with Matryoshka dimensions, /v1/rerank, /score; generation
refused); all five sequences of encoder_tiny.SEQS in one request."""
import numpy as np
import pytest

pytest.importorskip("gguf")

import encoder_tiny  # noqa: E402

from ember import LLM, Llama, _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.embedding import Embedder  # noqa: E402
from ember.pooling import PoolingParams  # noqa: E402
from ember.rerank import encode_pair  # noqa: E402

SEQS, TYPES = encoder_tiny.SEQS, encoder_tiny.TYPES
NAMES = ("bert", "bert-reranker", "gemma-embedding")


@pytest.fixture(scope="module")
def reference():
    return encoder_tiny.Reference()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    out = {}
    for name in NAMES:
        encoder_tiny.build(name, str(root / name))
        out[name] = str(root / f"{name}.gguf")
        convert(str(root / name), out[name], "f32", progress=False)
    return out


def l2(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def close(got, want, tol=1e-4):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape and np.abs(got - want).max() <= tol, np.abs(got - want).max()


def test_embedder_on_encoders(converted, reference):
    bert = _ember.Model(converted["bert"])
    emb = Embedder(bert, 64, n_threads=2)
    assert emb.encoder and emb.pooling == 1
    want = np.array([reference.get("bert", "pooled", i) for i in range(len(SEQS))])
    close(emb.embed_batch(SEQS, normalized=False), want)
    close(emb.embed_batch(SEQS), l2(want))
    with pytest.raises(ValueError, match="no classifier head"):
        Embedder(bert, 64, "rank")
    with pytest.raises(ValueError, match="input 1 has no tokens"):
        emb.embed_batch([[5], []])
    rr = Embedder(_ember.Model(converted["bert-reranker"]), 64, n_threads=2)
    assert rr.pooling == 4
    close(rr.score_batch(SEQS, TYPES), [reference.get("bert-reranker", "pooled", i)[0] for i in range(len(SEQS))])


def test_llm_and_llama_on_an_encoder(converted, reference):
    want = np.array([reference.get("gemma-embedding", "pooled", i) for i in range(len(SEQS))])
    with LLM(converted["gemma-embedding"], n_threads=2) as llm:
        out = llm.embed(SEQS)
        close([o.outputs.embedding for o in out], l2(want))
        assert [o.prompt_token_ids for o in out] == SEQS
        close([o.outputs.data for o in llm.encode(SEQS)], want)
        cut = llm.embed(SEQS, pooling_params=PoolingParams(dimensions=8))
        close([o.outputs.embedding for o in cut], l2(want[:, :8]))
        assert llm.max_num_seqs == 0 and llm.stats() is None and llm.n_ctx > 0
        with pytest.raises(ValueError, match="encoder model"):
            llm.generate("hello", use_tqdm=False)
    with LLM(converted["bert-reranker"], n_threads=2) as llm:
        docs = ["the fox", "a capital city", "foxes"]
        scores = [o.outputs.score for o in llm.score("what is a fox", docs)]
        enc = _ember.Encoder(_ember.Model(converted["bert-reranker"]), n_threads=2)
        pairs = [encode_pair(llm.tokenizer, "what is a fox", d) for d in docs]
        close(scores, enc.encode([p[0] for p in pairs], [p[1] for p in pairs])[:, 0])
    with Llama(converted["bert"], embedding=True, n_threads=2, verbose=False) as llm:
        text = "The quick brown fox"
        ids = llm.tokenize(text.encode())
        raw = _ember.Encoder(_ember.Model(converted["bert"]), n_threads=2).encode([ids])[0]
        close(llm.embed(text), l2(raw))
        close(llm.embed([text, text])[1], l2(raw))
    with pytest.raises(ValueError, match="encoder model"):
        Llama(converted["bert"], verbose=False)


def _client(llm, **settings):
    from fastapi.testclient import TestClient

    from ember import AsyncLLMEngine
    from ember.server.app import create_app
    from ember.server.args import ServerSettings
    return TestClient(create_app(AsyncLLMEngine.from_llm(llm), ServerSettings(**settings)))


def test_server_serves_an_encoder(converted, reference):
    want = np.array([reference.get("bert", "pooled", i) for i in range(len(SEQS))])
    with LLM(converted["bert"], n_threads=2) as llm, _client(llm) as c:
        assert c.get("/health").status_code == 200
        r = c.post("/v1/embeddings", json={"input": SEQS})
        assert r.status_code == 200, r.text
        close([d["embedding"] for d in r.json()["data"]], l2(want))
        r = c.post("/v1/embeddings", json={"input": SEQS, "dimensions": 4})
        close([d["embedding"] for d in r.json()["data"]], l2(want[:, :4]))
        assert c.post("/v1/embeddings", json={"input": [SEQS[0] * 3]}).status_code == 400   # past 64 positions
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "encoder" in r.json()["error"]["message"]
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
        assert r.status_code == 400 and "no rank head" in r.json()["error"]["message"]
        assert c.get("/metrics").status_code == 200
    with LLM(converted["bert-reranker"], n_threads=2) as llm, _client(llm) as c:
        r = c.post("/v1/rerank", json={"query": "what is a fox", "documents": ["the fox", "a city", "foxes"]})
        assert r.status_code == 200, r.text
        scores = [x["relevance_score"] for x in r.json()["results"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 3
        r = c.post("/v1/embeddings", json={"input": "hello"})
        assert r.status_code == 400 and "rank" in r.json()["error"]["message"]
