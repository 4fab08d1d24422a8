"""ember-server's ranking endpoints: /v1/rerank (with llama-server's /rerank and /v1/reranking, and vLLM's
/v2/rerank) in llama-server's and Jina/Cohere's shape (query, documents, top_n, return_documents; TEI's
"texts" form too), and vLLM's /score (/v1/score). They score with the model's rank head (a cross-encoder's
classifier, or a decoder's cls.output rows as llama.cpp converts Qwen3-Reranker); /score on an embedding
model without one gives the cosine similarity of the two texts' embeddings, as vLLM's does."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
from fastapi import Request

from ..embed_batching import BatchingEmbedder
from ..embedding import POOLING_NONE, POOLING_RANK, Embedder, has_rank_head
from ..rerank import rerank_template, score_pairs
from .openai_schema import APIError, bad_param, get


@dataclass
class RerankRequest:
    model: Optional[str]
    query: str
    documents: List[str]
    top_n: int
    return_documents: bool
    tei: bool   # TEI's form: "texts" in, a bare list out


def _documents(body: dict, name: str) -> List[str]:
    raw = body.get(name)
    if not isinstance(raw, list) or not raw:
        raise bad_param(name, f"'{name}' must be a non-empty array of strings")
    docs = []
    for i, d in enumerate(raw):
        if isinstance(d, dict) and isinstance(d.get("text"), str):   # Cohere's {"text": ...} form
            d = d["text"]
        if not isinstance(d, str):
            raise bad_param(name, f"'{name}[{i}]' must be a string, got {json.dumps(d)[:100]}")
        docs.append(d)
    return docs


def parse_rerank(body: dict) -> RerankRequest:
    if "query" not in body:
        raise APIError(400, "'query' is required", param="query", code="missing_required_parameter")
    query = get(body, "query", "str")
    tei = "texts" in body and "documents" not in body
    docs = _documents(body, "texts" if tei else "documents")
    top_n = get(body, "top_n", "int", len(docs), lambda v: v >= 1, "must be >= 1")
    flag = "return_text" if tei else "return_documents"
    return RerankRequest(model=get(body, "model", "str"), query=query, documents=docs, top_n=top_n,
                         return_documents=get(body, flag, "bool", False), tei=tei)


def _texts(body: dict, name: str) -> List[str]:
    raw = body.get(name)
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) for t in raw):
        raise bad_param(name, f"'{name}' must be a string or a non-empty array of strings")
    return raw


def parse_score(body: dict):
    """vLLM's /score body: text_1 (one text or several) against text_2's texts, pairwise or one to many."""
    first, second = _texts(body, "text_1"), _texts(body, "text_2")
    if len(first) == 1 and len(second) > 1:
        first = first * len(second)
    if len(first) != len(second):
        raise bad_param("text_2", f"'text_1' has {len(first)} texts and 'text_2' {len(second)}: give one first "
                                  f"text, or as many as second texts")
    return get(body, "model", "str"), first, second


class Ranking:
    """The server's ranking state: a rank Embedder, made at the first request that needs one."""

    def __init__(self, srv):
        self.srv = srv
        self._ranker: Optional[BatchingEmbedder] = None
        self._has_head: Optional[bool] = None
        self._lock = threading.Lock()

    def has_head(self) -> bool:
        if self._has_head is None:
            self._has_head = has_rank_head(self.srv.model)
        return self._has_head

    def ranker(self) -> BatchingEmbedder:
        srv = self.srv
        with self._lock:
            if self._ranker is None:
                if not self.has_head():
                    raise APIError(400, f"this server's model ({srv.model.arch}) has no rank head: it cannot rerank. "
                                        f"Serve a reranker (a cross-encoder such as bge-reranker, or a Qwen3-Reranker "
                                        f"GGUF) to use this endpoint", code="model_not_reranker")
                self._ranker = BatchingEmbedder(Embedder(srv.model, srv.n_ctx, POOLING_RANK), busy=srv.decoding)
            return self._ranker

    def scores(self, queries: List[str], documents: List[str]):
        try:
            return score_pairs(self.ranker(), self.srv.tok, rerank_template(self.srv.model), queries, documents)
        except ValueError as e:
            raise APIError(400, str(e), code="invalid_value") from None

    def similarity(self, first: List[str], second: List[str]):
        """Cosine similarity of embeddings, for /score on an embedding model."""
        srv = self.srv
        if srv.pooling in (POOLING_NONE, POOLING_RANK):
            raise APIError(400, "this server's model has no rank head and no pooled embeddings: /score needs a "
                                "reranker, or an embedding model with pooling mean, cls or last (--pooling)",
                           code="model_not_reranker")
        seqs = [list(srv.tok.encode(t.encode("utf-8"), True, True)) for t in first + second]
        try:
            vectors = srv.embedder().embed_batch(seqs)
        except ValueError as e:
            raise APIError(400, str(e), code="invalid_value") from None
        n = len(first)
        return [float(np.dot(a, b)) for a, b in zip(vectors[:n], vectors[n:])], sum(len(s) for s in seqs)


def rerank_response(req: RerankRequest, scores: List[float], n_tokens: int, model_id: str):
    key = "score" if req.tei else "relevance_score"
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
    results = []
    for i in order:
        r = {"index": i, key: scores[i]}
        if req.return_documents:
            r.update({"text": req.documents[i]} if req.tei else {"document": {"text": req.documents[i]}})
        results.append(r)
    if req.tei:
        return results
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": req.model or model_id, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}


def register(app, srv) -> None:
    ranking = Ranking(srv)

    @app.post("/v1/rerank")
    @app.post("/rerank")
    @app.post("/v1/reranking")
    @app.post("/v2/rerank")
    async def rerank(request: Request):
        srv.ready()
        req = await srv.cpu(parse_rerank, await srv.body(request))
        srv.check_model(req.model)
        t0 = time.perf_counter()
        scores, n_tokens = await asyncio.to_thread(ranking.scores, [req.query] * len(req.documents), req.documents)
        request.state.log = f"rerank documents={len(req.documents)} prompt={n_tokens} " \
                            f"total={(time.perf_counter() - t0) * 1e3:.0f}ms"
        return await srv.reply(rerank_response, req, scores, n_tokens, srv.model_id)

    @app.post("/score")
    @app.post("/v1/score")
    async def score(request: Request):
        srv.ready()
        model, first, second = await srv.cpu(parse_score, await srv.body(request))
        srv.check_model(model)
        if ranking.has_head():
            scores, n_tokens = await asyncio.to_thread(ranking.scores, first, second)
        else:
            scores, n_tokens = await asyncio.to_thread(ranking.similarity, first, second)
        return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": model or srv.model_id,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens, "completion_tokens": 0}}
