"""Rank pooling and the ranking APIs on a decoder reranker made as llama.cpp converts Qwen3-Reranker (a tiny
random Llama whose GGUF gains cls.output = two rows of its output matrix, pooling_type 4, classifier labels and
a rerank prompt template): its score is the softmax of those rows' logits at the last token, checked against the
logits of a plain context; pair layouts; LLM.score / embed / encode in vLLM's shape (Matryoshka dimensions,
cosine scores of an embedding model); ember-server's /v1/rerank (and aliases) and /score in llama-server's,
Jina/Cohere's, TEI's and vLLM's shapes; --embedding / --reranking; bad requests."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package writes the reranker's GGUF")

import hf_tiny  # noqa: E402

from ember import LLM, Llama, _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.embedding import Embedder, has_rank_head  # noqa: E402
from ember.pooling import PoolingParams  # noqa: E402
from ember.rerank import encode_pair, rerank_template  # noqa: E402

TEMPLATE = "judge: {query} | {document} ->"
YES, NO = 17, 42   # the two rows of the head (Qwen3-Reranker's "yes" and "no")


def _rewrite(src, dst, keys, tensors):
    """A copy of a GGUF with keys ({name: (value, GGUFValueType)}) and tensors ({name: float32 array}) added."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture" and f.name not in keys:
            writer.add_key_value(f.name, f.contents(), f.types[0],
                                 f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for name, (value, kind, *sub) in keys.items():
        writer.add_key_value(name, value, kind, sub[0] if sub else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank")
    hf_tiny.build("embed-llama", str(root / "hf"))
    plain = str(root / "plain.gguf")
    convert(str(root / "hf"), plain, "f32", progress=False)
    out = next(t for t in gguf.GGUFReader(plain).tensors if t.name == "output.weight")
    rows = np.asarray(out.data, dtype=np.float32).reshape(-1, out.shape[0])[[YES, NO]].copy()
    T = gguf.GGUFValueType
    reranker = _rewrite(plain, str(root / "reranker.gguf"), {
        "llama.pooling_type": (4, T.UINT32),
        "llama.classifier.output_labels": (["yes", "no"], T.ARRAY, T.STRING),
        "tokenizer.chat_template.rerank": (TEMPLATE, T.STRING),
    }, {"cls.output.weight": rows})
    mean = _rewrite(plain, str(root / "mean.gguf"), {"llama.pooling_type": (1, T.UINT32)}, {})
    return {"plain": plain, "reranker": reranker, "mean": mean}


def expected_score(path, ids):
    """P(yes) from the logits of a plain context: the softmax of the yes and no logits at the last token."""
    ctx = _ember.Context(_ember.Model(path), n_ctx=128, n_threads=2)   # the default KV type, as the Embedder
    ctx.eval(ids, False)
    logits = ctx.logits().astype(np.float64).reshape(-1)
    a, b = logits[YES], logits[NO]
    return 1.0 / (1.0 + np.exp(b - a))


QUERY = "what is a fox"
DOCS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "foxes are small canids"]


def test_decoder_rank_head_scores_yes_against_no(paths):
    m = _ember.Model(paths["reranker"])
    assert m.pooling_type == 4 and has_rank_head(m) and not has_rank_head(_ember.Model(paths["plain"]))
    assert rerank_template(m) == TEMPLATE and rerank_template(_ember.Model(paths["plain"])) is None
    emb = Embedder(m, 128, n_threads=2)
    tok = m.tokenizer
    seqs = [encode_pair(tok, QUERY, d, TEMPLATE)[0] for d in DOCS]
    assert seqs[0] == list(tok.encode(f"judge: {QUERY} | {DOCS[0]} ->".encode(), False, True))
    got = emb.score_batch(seqs)
    want = [expected_score(paths["reranker"], s) for s in seqs]
    assert np.allclose(got, want, rtol=0, atol=2e-5), (got, want)
    assert len(set(np.round(got, 6))) == 3 and all(0 < s < 1 for s in got)
    with pytest.raises(ValueError, match="rank"):
        emb.embed_batch(seqs)
    with pytest.raises(ValueError, match="input 1 has no tokens"):
        emb.score_batch([seqs[0], []])
    with pytest.raises(ValueError, match="more than the context of 128"):
        emb.score_batch([list(range(3, 200))])
    with pytest.raises(ValueError, match="no rank head"):
        Embedder(_ember.Model(paths["plain"]), 128, "rank")


def test_pair_layouts():
    bert = _ember.Tokenizer.from_vocab("bert", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581a", "\u2581b", "c"],
                                       token_types=[3, 3, 3, 3, 1, 1, 1], bos=2, unk=1, sep=3)
    assert encode_pair(bert, "a", "bc") == ([2, 4, 3, 5, 6, 3], [0, 0, 0, 1, 1, 1])
    bpe = _ember.Tokenizer.from_vocab("gpt2", ["<s>", "</s>", "a", "b"], token_types=[3, 3, 1, 1], bos=0, eos=1,
                                      add_bos=True)
    assert encode_pair(bpe, "a", "b") == ([0, 2, 3], [0] * 3)   # llama.cpp's: BOS q d, no EOS asked for
    bpe = _ember.Tokenizer.from_vocab("gpt2", ["<s>", "</s>", "a", "b"], token_types=[3, 3, 1, 1], bos=0, eos=1,
                                      add_bos=True, add_eos=True)
    assert encode_pair(bpe, "a", "b") == ([0, 2, 1, 3, 1], [0] * 5)   # BOS q EOS d EOS
    with pytest.raises(TypeError):
        encode_pair(bert, "a", None)


def test_llm_score_embed_encode(paths):
    with LLM(paths["reranker"], n_ctx=128, n_threads=2) as llm:
        out = llm.score(QUERY, DOCS)
        assert [type(o.outputs).__name__ for o in out] == ["ScoringOutput"] * 3
        tok = llm.tokenizer
        want = [expected_score(paths["reranker"], encode_pair(tok, QUERY, d, TEMPLATE)[0]) for d in DOCS]
        assert np.allclose([o.outputs.score for o in out], want, atol=2e-5)
        pairwise = llm.score([QUERY, "x"], DOCS[:2])
        assert np.isclose(pairwise[0].outputs.score, out[0].outputs.score, atol=1e-6)
        with pytest.raises(ValueError, match="2 first texts for 3"):
            llm.score([QUERY, "x"], DOCS)
        with pytest.raises(ValueError, match="no prompts"):
            llm.score(QUERY, [])
        with pytest.raises(ValueError, match="rank"):   # a reranker gives scores, not embeddings
            llm.embed("hello")
        # The engine still generates beside the pooling.
        assert llm.generate("hello", use_tqdm=False)[0].outputs[0].token_ids
    with LLM(paths["mean"], n_ctx=128, n_threads=2) as llm:
        e = llm.embed(["The quick brown fox", "Paris"])
        v = np.asarray(e[0].outputs.embedding)
        assert len(v) == 64 and np.isclose(np.linalg.norm(v), 1, atol=1e-5) and e[0].outputs.hidden_size == 64
        raw = llm.encode("The quick brown fox")[0].outputs.data
        assert np.allclose(raw / np.linalg.norm(raw), v, atol=1e-5)
        cut = np.asarray(llm.embed("The quick brown fox", pooling_params=PoolingParams(dimensions=16))[0]
                         .outputs.embedding)
        assert np.allclose(cut, v[:16] / np.linalg.norm(v[:16]), atol=1e-5)
        unnormed = llm.embed("The quick brown fox", pooling_params=PoolingParams(normalize=False))[0]
        assert np.allclose(unnormed.outputs.embedding, raw, atol=1e-5)
        # An embedding model's score is the cosine similarity of the two embeddings (vLLM's).
        s = llm.score("The quick brown fox", "Paris")[0].outputs.score
        assert np.isclose(s, float(np.dot(v, e[1].outputs.embedding)), atol=1e-5)
        with pytest.raises(ValueError, match="dimensions is 65"):
            llm.embed("x", pooling_params=PoolingParams(dimensions=65))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            llm.embed([[1, 2, 100000]])
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            llm.embed("x", truncate_prompt_tokens=0)
        assert llm.embed([5, 6, 7, 8], truncate_prompt_tokens=2)[0].prompt_token_ids == [7, 8]
    with LLM(paths["plain"], n_ctx=128, n_threads=2) as llm:   # no pooling key: per-token vectors
        with pytest.raises(ValueError, match="pools none"):
            llm.embed("hello")
        assert llm.encode("hello there")[0].outputs.data.ndim == 2
        with pytest.raises(ValueError, match="no rank head and pools none"):
            llm.score("a", "b")
    with LLM(paths["plain"], n_ctx=128, n_threads=2, pooling_type=3) as llm:
        assert len(llm.embed("hello")[0].outputs.embedding) == 64


def test_llama_rank_pooling(paths):
    with Llama(paths["reranker"], n_ctx=128, n_threads=2, embedding=True, verbose=False) as llm:
        assert llm.pooling_type() == 4
        text = TEMPLATE.replace("{query}", QUERY).replace("{document}", DOCS[0])
        (score,) = llm.embed(text)
        assert np.isclose(score, expected_score(paths["reranker"], llm.tokenize(text.encode(), special=False)),
                          atol=2e-5)
    with pytest.raises(ValueError, match="pooling_type"):
        Llama(paths["plain"], embedding=True, pooling_type=5, verbose=False)
    with pytest.raises(ValueError, match="no rank head"):
        Llama(paths["plain"], embedding=True, pooling_type=4, verbose=False)


# ---- ember-server ------------------------------------------------------------------------------
def _client(llm, **settings):
    from fastapi.testclient import TestClient

    from ember import AsyncLLMEngine
    from ember.server.app import create_app
    from ember.server.args import ServerSettings
    return TestClient(create_app(AsyncLLMEngine.from_llm(llm), ServerSettings(**settings)))


@pytest.fixture(scope="module")
def reranker_llm(paths):
    with LLM(paths["reranker"], n_ctx=128, n_threads=2, max_num_seqs=2) as llm:
        yield llm


def test_server_rerank_shapes(reranker_llm, paths):
    tok = reranker_llm.tokenizer
    want = [expected_score(paths["reranker"], encode_pair(tok, QUERY, d, TEMPLATE)[0]) for d in DOCS]
    order = list(np.argsort(want)[::-1])
    with _client(reranker_llm) as c:
        for route in ("/v1/rerank", "/rerank", "/v1/reranking", "/v2/rerank"):
            r = c.post(route, json={"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
            assert [x["index"] for x in body["results"]] == order[:2]
            assert np.allclose([x["relevance_score"] for x in body["results"]], [want[i] for i in order[:2]],
                               atol=2e-5)
            assert body["results"][0]["document"] == {"text": DOCS[order[0]]}
        r = c.post("/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS]}).json()
        assert len(r["results"]) == 3 and "document" not in r["results"][0]   # Cohere's form; all by default
        tei = c.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
        assert isinstance(tei, list) and tei[0] == {"index": int(order[0]), "score": pytest.approx(want[order[0]],
                                                    abs=2e-5), "text": DOCS[order[0]]}
        s = c.post("/score", json={"text_1": QUERY, "text_2": DOCS}).json()
        assert [d["index"] for d in s["data"]] == [0, 1, 2] and s["data"][0]["object"] == "score"
        assert np.allclose([d["score"] for d in s["data"]], want, atol=2e-5)
        assert c.post("/v1/score", json={"text_1": [QUERY], "text_2": DOCS[0]}).status_code == 200
        # A reranker's server gives no embeddings.
        r = c.post("/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 400 and "rank" in r.json()["error"]["message"]


@pytest.mark.parametrize("route, body, param", [
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q"}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": "abc"}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a", 3]}, "documents"),
    ("/v1/rerank", {"query": 5, "documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "other"}, "model"),
    ("/score", {"text_1": "q"}, "text_2"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/score", {"text_1": [], "text_2": "a"}, "text_1"),
])
def test_server_rerank_errors(reranker_llm, route, body, param):
    with _client(reranker_llm) as c:
        r = c.post(route, json=body)
        assert 400 <= r.status_code < 500, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"]


def test_server_rerank_too_long(reranker_llm):
    with _client(reranker_llm) as c:
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["word " * 300]})
        assert r.status_code == 400 and "more than the context" in r.json()["error"]["message"]


def test_server_without_rank_head(paths):
    with LLM(paths["plain"], n_ctx=128, n_threads=2, max_num_seqs=2) as llm, _client(llm) as c:
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
        assert r.status_code == 400 and "no rank head" in r.json()["error"]["message"]
        r = c.post("/score", json={"text_1": "q", "text_2": "a"})   # and no pooled embeddings either
        assert r.status_code == 400 and "no rank head" in r.json()["error"]["message"]
    with LLM(paths["mean"], n_ctx=128, n_threads=2, max_num_seqs=2) as llm, _client(llm) as c:
        s = c.post("/score", json={"text_1": "The quick brown fox", "text_2": ["The quick brown fox", "Paris"]})
        assert s.status_code == 200 and np.isclose(s.json()["data"][0]["score"], 1.0, atol=1e-5)


def test_embedding_and_reranking_flags(reranker_llm):
    from ember.server.args import parse_args, settings
    st = settings(parse_args(["-m", "x.gguf", "--reranking"]))
    assert st.pooling == "rank" and st.embedding_only
    st = settings(parse_args(["-m", "x.gguf", "--embedding", "--pooling", "mean"]))
    assert st.pooling == "mean" and st.embedding_only
    assert not settings(parse_args(["-m", "x.gguf"])).embedding_only
    with _client(reranker_llm, embedding_only=True, pooling="rank") as c:
        r = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 400 and "--embedding" in r.json()["error"]["message"]
        assert c.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200
