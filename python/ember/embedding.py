"""Embeddings and rank scores as llama.cpp computes them, pooled as the GGUF's `{arch}.pooling_type` says (or
as the caller overrides it): encoder models (bert, nomic-bert, gemma-embedding) through `_ember.Encoder`, which
packs many sequences into one forward; decoders through an embedding Context (the hidden states after the final
norm), one sequence at a time. Rank pooling gives a score per sequence: an encoder's classifier head, or for a
decoder (Qwen3-Reranker as llama.cpp converts it) the softmax of its cls.output rows over the last token, whose
first row is the "yes". Llama.embed / create_embedding, LLM.embed / score / encode and ember-server's
/v1/embeddings, /v1/rerank and /score all use it."""
from __future__ import annotations

import threading
from typing import List, Optional, Sequence, Union

import numpy as np

from . import _ember

# llama.cpp's enum llama_pooling_type.
POOLING_UNSPECIFIED, POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = -1, 0, 1, 2, 3, 4
POOLING_NAMES = {"none": POOLING_NONE, "mean": POOLING_MEAN, "cls": POOLING_CLS, "last": POOLING_LAST,
                 "rank": POOLING_RANK}


def is_encoder(model) -> bool:
    """Whether the model is an encoder (bidirectional attention, run by _ember.Encoder)."""
    return bool(getattr(model, "is_encoder", False))


def resolve_pooling(model, pooling: Union[int, str, None] = POOLING_UNSPECIFIED) -> int:
    """The pooling an embedding context uses, as llama.cpp resolves it: an explicit pooling (an id
    or a name) wins; unspecified (-1 or None) takes the file's {arch}.pooling_type, and a file
    without that key (decoder models) pools nothing: per-token vectors (llama_context's default)."""
    if pooling is None or pooling == POOLING_UNSPECIFIED:
        pooling = model.pooling_type
    if isinstance(pooling, str):
        if pooling not in POOLING_NAMES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_NAMES)}, got {pooling!r}")
        return POOLING_NAMES[pooling]
    if isinstance(pooling, bool) or int(pooling) not in POOLING_NAMES.values():
        raise ValueError(f"pooling_type {pooling!r} is not supported: 0 none, 1 mean, 2 cls, 3 last, 4 rank "
                         f"(or -1: the model's)")
    return int(pooling)


def pooling_name(pooling: int) -> str:
    return next(name for name, p in POOLING_NAMES.items() if p == pooling)


def normalize(v: np.ndarray) -> np.ndarray:
    """L2 normalization over the last axis, as llama.cpp's common_embd_normalize(embd_norm=2): a
    zero vector stays zero."""
    norm = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (v / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def truncate_dimensions(v: np.ndarray, dimensions: Optional[int], normalized: bool = True) -> np.ndarray:
    """Matryoshka truncation: the first `dimensions` values (normalized again where the whole vector was);
    None keeps the whole vector. More than the model's width is a ValueError."""
    if dimensions is None:
        return v
    if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) or dimensions < 1:
        raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
    if dimensions > v.shape[-1]:
        raise ValueError(f"dimensions is {dimensions}, but this model's embeddings have {v.shape[-1]}")
    cut = v[..., :dimensions]
    return normalize(cut) if normalized else cut


def embed_tokens(ctx, tokens: List[int], pooling: int, normalized: bool) -> np.ndarray:
    """One sequence's embedding from a decoder's embedding Context, which is left empty: [n_embd]
    pooled, or [len(tokens), n_embd] with pooling none. A decoder attends causally, so the CLS row
    (the first token's) needs only the first token evaluated."""
    ctx.truncate(0)
    try:
        if pooling == POOLING_CLS:
            ctx.eval(tokens[:1], False)
            out = ctx.embeddings(0)
        elif pooling in (POOLING_LAST, POOLING_RANK):
            ctx.eval(tokens, False)
            out = ctx.embeddings(-1)
        else:
            ctx.eval(tokens, True)
            rows = ctx.all_embeddings()
            out = rows.mean(axis=0, dtype=np.float64).astype(np.float32) if pooling == POOLING_MEAN else rows
    finally:
        ctx.truncate(0)
    return normalize(out) if normalized else out


def _tensor(f, info) -> np.ndarray:
    """A GGUF tensor as float32 [rows, cols] (any stored type the gguf package dequantizes)."""
    import gguf
    raw = np.asarray(f.tensor_data(info["name"]))
    ne = list(info["ne"])
    qtype = gguf.GGMLQuantizationType(info["type"])
    if qtype == gguf.GGMLQuantizationType.F32:
        data = raw.view(np.float32)
    elif qtype == gguf.GGMLQuantizationType.F16:
        data = raw.view(np.float16).astype(np.float32)
    else:
        data = gguf.quants.dequantize(raw.reshape(int(np.prod(ne[1:], dtype=np.int64)), -1), qtype)
    return np.asarray(data, dtype=np.float32).reshape(int(np.prod(ne[1:], dtype=np.int64)), ne[0])


def has_rank_head(model) -> bool:
    """Whether the model can score (query, document) pairs: an encoder with a classifier head, or a
    decoder whose GGUF has llama.cpp's cls.output rows (Qwen3-Reranker)."""
    if is_encoder(model):
        return int(getattr(model, "n_cls_out", 0)) > 0
    return any(t["name"] == "cls.output.weight" for t in _ember.GGUFFile(model.path, False).tensors())


class DecoderRankHead:
    """A decoder's rank head as llama.cpp converts Qwen3-Reranker: cls.output (+ bias) over the last token's
    final-normed hidden state; with several rows (["yes", "no"]) their softmax, whose first entry is the score
    (the probability of "yes"); with one row its raw value."""

    def __init__(self, model):
        f = _ember.GGUFFile(model.path, False)
        infos = {t["name"]: t for t in f.tensors()}
        if "cls.output.weight" not in infos:
            raise ValueError(f"{model.arch} model {model.path} has no rank head: rank pooling needs a reranker "
                             f"(an encoder with a classifier, or a decoder GGUF with cls.output rows such as "
                             f"Qwen3-Reranker's), not a chat or embedding model")
        self.weight = _tensor(f, infos["cls.output.weight"])
        if self.weight.shape[1] != model.n_embd:
            raise ValueError(f"cls.output.weight has rows of {self.weight.shape[1]}, expected n_embd {model.n_embd}")
        bias = infos.get("cls.output.bias")
        self.bias = _tensor(f, bias).reshape(-1) if bias is not None else np.zeros(self.weight.shape[0], np.float32)

    def __call__(self, hidden: np.ndarray) -> float:
        logits = self.weight.astype(np.float64) @ hidden.astype(np.float64) + self.bias
        if len(logits) == 1:
            return float(logits[0])
        p = np.exp(logits - logits.max())
        return float(p[0] / p.sum())


class Embedder:
    """Embeddings or rank scores of an already loaded Model (it shares the weights): encoders through an
    Encoder (many sequences packed into each forward), decoders through an embedding Context. Callers from
    several threads take turns. ember-server answers /v1/embeddings and /v1/rerank with these, beside the
    engine that generates."""

    def __init__(self, model, n_ctx: int, pooling: Union[int, str, None] = None, n_batch: int = 512,
                 n_threads: int = 0):
        self.pooling = resolve_pooling(model, pooling)
        self.n_ctx = n_ctx
        self.encoder = is_encoder(model)
        self._lock = threading.Lock()
        self._head = None
        if self.encoder:
            if self.pooling == POOLING_RANK and not has_rank_head(model):
                raise ValueError(f"{model.arch} model {model.path} has no classifier head: rank pooling needs a "
                                 f"reranker (cross-encoder)")
            # Each sequence must fit one forward.
            self._enc = _ember.Encoder(model, n_batch=max(n_batch, n_ctx), n_threads=n_threads, pooling=self.pooling)
        else:
            if self.pooling == POOLING_RANK:
                self._head = DecoderRankHead(model)
            self._ctx = _ember.Context(model, n_ctx=n_ctx, n_batch=min(n_batch, n_ctx), n_threads=n_threads,
                                       embeddings=True)

    def check_inputs(self, seqs: Sequence[List[int]]) -> None:
        """ValueError naming the first input that is empty or longer than the context."""
        for i, seq in enumerate(seqs):
            if not seq:
                raise ValueError(f"input {i} has no tokens")
            if len(seq) > self.n_ctx:
                raise ValueError(f"input {i} is {len(seq)} tokens, more than the context of {self.n_ctx}")

    def embed_batch(self, seqs: Sequence[List[int]], normalized: bool = True) -> List[np.ndarray]:
        """Each sequence's embedding ([n_embd], or [len, n_embd] with pooling none)."""
        if self.pooling == POOLING_RANK:
            raise ValueError("this model pools by rank: it scores (query, document) pairs and gives no embeddings "
                             "(use pooling mean, cls or last for embeddings)")
        self.check_inputs(seqs)
        with self._lock:
            if self.encoder:
                out = self._enc.encode([list(s) for s in seqs])
                rows = [np.asarray(r, dtype=np.float32) for r in out]
            else:
                rows = [embed_tokens(self._ctx, list(s), self.pooling, False) for s in seqs]
        return [normalize(r) if normalized else r for r in rows]

    def embed(self, tokens: List[int], normalized: bool = True) -> np.ndarray:
        return self.embed_batch([tokens], normalized)[0]

    def score_batch(self, seqs: Sequence[List[int]], token_types: Optional[Sequence[List[int]]] = None) -> List[float]:
        """Each sequence's rank score (pooling rank only): the classifier's first output."""
        if self.pooling != POOLING_RANK:
            raise ValueError(f"scores need rank pooling; this embedder pools by {pooling_name(self.pooling)}")
        self.check_inputs(seqs)
        with self._lock:
            if self.encoder:
                types = None if token_types is None else [list(t) for t in token_types]
                out = np.asarray(self._enc.encode([list(s) for s in seqs], types), dtype=np.float32)
                return [float(v) for v in out.reshape(len(seqs), -1)[:, 0]]
            return [self._head(embed_tokens(self._ctx, list(s), POOLING_RANK, False)) for s in seqs]
