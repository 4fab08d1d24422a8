"""LLM's pooling API in vLLM's shape: PoolingParams, LLM.embed / score / encode's request outputs, and the
work behind them over an Embedder (embedding.py): embeddings, Matryoshka truncation, cross-encoder scores of
(query, document) pairs, or, for embedding models without a rank head, the cosine similarity of the two
texts' embeddings (what vLLM's score does for them)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import List, Optional, Union

import numpy as np

from .embedding import POOLING_NONE, POOLING_RANK, Embedder, has_rank_head, truncate_dimensions
from .rerank import rerank_template, score_pairs


@dataclass
class PoolingParams:
    """vLLM's: dimensions (Matryoshka: the first dimensions values of each embedding, normalized again) and
    normalize (L2; None: yes for embeddings)."""
    dimensions: Optional[int] = None
    normalize: Optional[bool] = None


@dataclass
class EmbeddingOutput:
    embedding: List[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingOutput:
    data: np.ndarray


@dataclass
class PoolingRequestOutput:
    """One prompt's result: request_id, its prompt token ids and outputs (an EmbeddingOutput, ScoringOutput
    or PoolingOutput)."""
    request_id: str
    outputs: Union[EmbeddingOutput, ScoringOutput, PoolingOutput]
    prompt_token_ids: List[int] = field(default_factory=list)
    finished: bool = True


EmbeddingRequestOutput = ScoringRequestOutput = PoolingRequestOutput


def _texts(data, what: str) -> list:
    if isinstance(data, (str, dict)):
        return [data]
    items = list(data)
    if items and isinstance(items[0], (int, np.integer)):
        return [items]
    if not items:
        raise ValueError(f"{what}: no prompts given")
    return items


class Pooler:
    """The pooling side of an LLM: an Embedder made at first use (it takes its own context memory)."""

    def __init__(self, model, tokenizer, n_ctx: int, pooling, n_threads: int = 0):
        self._model, self._tok, self.n_ctx = model, tokenizer, n_ctx
        self._pooling, self._n_threads = pooling, n_threads
        self._embedder: Optional[Embedder] = None
        self._ranker: Optional[Embedder] = None
        self._ids = itertools.count()

    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = Embedder(self._model, self.n_ctx, self._pooling, n_threads=self._n_threads)
        return self._embedder

    def ranker(self) -> Embedder:
        if self._ranker is None:
            if not has_rank_head(self._model):
                raise ValueError(f"{self._model.arch} model {self._model.path} has no rank head: it cannot score "
                                 f"(query, document) pairs")
            self._ranker = Embedder(self._model, self.n_ctx, POOLING_RANK, n_threads=self._n_threads)
        return self._ranker

    def _tokens(self, prompt, truncate: Optional[int]) -> List[int]:
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            ids = list(self._tok.encode(prompt.encode("utf-8"), True, True))
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in prompt):
            ids = [int(t) for t in prompt]
            bad = next((t for t in ids if not 0 <= t < self._tok.n_vocab), None)
            if bad is not None:
                raise ValueError(f"token id {bad} is outside the vocabulary (0..{self._tok.n_vocab - 1})")
        else:
            raise TypeError(f"a prompt must be a str, token ids or a prompt dict, got {type(prompt).__name__}")
        if truncate is not None:
            if truncate < 1:
                raise ValueError(f"truncate_prompt_tokens must be >= 1, got {truncate}")
            ids = ids[-truncate:]
        if not ids:
            raise ValueError("a prompt has no tokens to embed (an empty text and no BOS)")
        return ids

    def pooled(self, prompts, params: Optional[PoolingParams], truncate: Optional[int], normalize_default: bool):
        p = params or PoolingParams()
        seqs = [self._tokens(x, truncate) for x in _texts(prompts, "embed")]
        emb = self.embedder()
        normalized = normalize_default if p.normalize is None else bool(p.normalize)
        rows = emb.embed_batch(seqs, normalized)
        if p.dimensions is not None:
            if emb.pooling == POOLING_NONE:
                raise ValueError("dimensions needs pooled embeddings; this model pools none (per-token vectors)")
            rows = [truncate_dimensions(r, p.dimensions, normalized) for r in rows]
        return seqs, rows

    def embed(self, prompts, params: Optional[PoolingParams] = None,
              truncate: Optional[int] = None) -> List[PoolingRequestOutput]:
        if self.embedder().pooling == POOLING_NONE:
            raise ValueError("this model pools none (per-token vectors): LLM.embed needs mean, cls or last pooling "
                             "(LLM(..., pooling_type=1)); LLM.encode gives the per-token vectors")
        seqs, rows = self.pooled(prompts, params, truncate, True)
        return [PoolingRequestOutput(str(next(self._ids)), EmbeddingOutput(r.tolist()), s) for s, r in zip(seqs, rows)]

    def encode(self, prompts, params: Optional[PoolingParams] = None,
               truncate: Optional[int] = None) -> List[PoolingRequestOutput]:
        seqs, rows = self.pooled(prompts, params, truncate, False)
        return [PoolingRequestOutput(str(next(self._ids)), PoolingOutput(r), s) for s, r in zip(seqs, rows)]

    def score(self, data_1, data_2, truncate: Optional[int] = None) -> List[PoolingRequestOutput]:
        first, second = pair_up(data_1, data_2)
        if has_rank_head(self._model):
            for x in (*first, *second):
                if not isinstance(x, str):
                    raise TypeError("a reranker scores texts: data_1 and data_2 must be str or lists of str")
            ranker = self.ranker()
            scores, _ = score_pairs(ranker, self._tok, rerank_template(self._model), first, second)
            return [PoolingRequestOutput(str(next(self._ids)), ScoringOutput(s)) for s in scores]
        if self.embedder().pooling == POOLING_NONE:
            raise ValueError("this model has no rank head and pools none: score needs a reranker or pooled "
                             "embeddings (LLM(..., pooling_type=1))")
        _, a = self.pooled(first, None, truncate, True)
        _, b = self.pooled(second, None, truncate, True)
        return [PoolingRequestOutput(str(next(self._ids)), ScoringOutput(float(np.dot(x, y)))) for x, y in zip(a, b)]


def pair_up(data_1, data_2) -> tuple:
    """vLLM's pairing: one first text against each second text, or the two lists pairwise."""
    first = _texts(data_1, "score")
    second = _texts(data_2, "score")
    if len(first) == 1 and len(second) > 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValueError(f"score: {len(first)} first texts for {len(second)} second texts (give one, or as many)")
    return first, second

