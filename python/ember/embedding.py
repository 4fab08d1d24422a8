"""Embeddings as llama.cpp computes them: the hidden states after the final norm (the rows of an
embedding Context), pooled per sequence as the GGUF's `{arch}.pooling_type` says (or as the caller
overrides it) and L2-normalized. Llama.embed / create_embedding and ember-server's /v1/embeddings
both use it."""
from __future__ import annotations

import threading
from typing import List, Union

import numpy as np

from . import _ember

# llama.cpp's enum llama_pooling_type (rank, 4, needs a classifier head ember does not load).
POOLING_UNSPECIFIED, POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST = -1, 0, 1, 2, 3
POOLING_NAMES = {"none": POOLING_NONE, "mean": POOLING_MEAN, "cls": POOLING_CLS, "last": POOLING_LAST}


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
        raise ValueError(f"pooling_type {pooling!r} is not supported: 0 none, 1 mean, 2 cls, 3 last "
                         f"(or -1: the model's)")
    return int(pooling)


def pooling_name(pooling: int) -> str:
    return next(name for name, p in POOLING_NAMES.items() if p == pooling)


def normalize(v: np.ndarray) -> np.ndarray:
    """L2 normalization over the last axis, as llama.cpp's common_embd_normalize(embd_norm=2): a
    zero vector stays zero."""
    norm = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (v / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def embed_tokens(ctx, tokens: List[int], pooling: int, normalized: bool) -> np.ndarray:
    """One sequence's embedding from an embedding Context, which is left empty: [n_embd] pooled,
    or [len(tokens), n_embd] with pooling none. Every ember model attends causally, so the CLS
    row (the first token's) needs only the first token evaluated."""
    ctx.truncate(0)
    try:
        if pooling == POOLING_CLS:
            ctx.eval(tokens[:1], False)
            out = ctx.embeddings(0)
        elif pooling == POOLING_LAST:
            ctx.eval(tokens, False)
            out = ctx.embeddings(-1)
        else:
            ctx.eval(tokens, True)
            rows = ctx.all_embeddings()
            out = rows.mean(axis=0, dtype=np.float64).astype(np.float32) if pooling == POOLING_MEAN else rows
    finally:
        ctx.truncate(0)
    return normalize(out) if normalized else out


class Embedder:
    """An embedding Context on an already loaded Model (it shares the weights), one sequence at a
    time: callers from several threads take turns. ember-server answers /v1/embeddings with one,
    beside the engine that generates."""

    def __init__(self, model, n_ctx: int, pooling: Union[int, str, None] = None, n_batch: int = 512,
                 n_threads: int = 0):
        self.pooling = resolve_pooling(model, pooling)
        self.n_ctx = n_ctx
        self._ctx = _ember.Context(model, n_ctx=n_ctx, n_batch=min(n_batch, n_ctx), n_threads=n_threads,
                                   embeddings=True)
        self._lock = threading.Lock()

    def embed(self, tokens: List[int], normalized: bool = True) -> np.ndarray:
        with self._lock:
            return embed_tokens(self._ctx, tokens, self.pooling, normalized)

