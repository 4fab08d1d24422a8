"""Many requests' inputs in shared forwards: a BatchingEmbedder queues what concurrent callers ask of one Embedder
and runs everything queued at once (an encoder packs those sequences into few forwards), so a server answering
many small /v1/embeddings or /v1/rerank requests pays for few forwards. The first caller to find no batch running
runs batches until the queue is empty; the others wait for their results."""
from __future__ import annotations

import threading
from typing import List, Optional, Sequence

import numpy as np

from .embedding import Embedder

MAX_BATCH_TOKENS = 16384   # bounds one batch's activations; a single larger request still runs alone


class _Job:
    def __init__(self, kind: str, seqs: List[List[int]], types: Optional[List[List[int]]], normalized: bool):
        self.kind, self.seqs, self.types, self.normalized = kind, seqs, types, normalized
        self.result = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()

    @property
    def key(self):
        return self.kind, self.normalized, self.types is None

    @property
    def n_tokens(self) -> int:
        return sum(len(s) for s in self.seqs)


class BatchingEmbedder:
    """An Embedder's embed_batch / score_batch, shared by concurrent callers (its other attributes pass
    through). batches counts the Embedder calls made."""

    def __init__(self, embedder: Embedder, max_batch_tokens: int = MAX_BATCH_TOKENS):
        self.embedder = embedder
        self.max_batch_tokens = max_batch_tokens
        self.batches = 0
        self._lock = threading.Lock()
        self._pending: List[_Job] = []
        self._running = False

    def __getattr__(self, name):
        return getattr(self.embedder, name)

    def embed_batch(self, seqs: Sequence[List[int]], normalized: bool = True) -> List[np.ndarray]:
        return self._submit(_Job("embed", [list(s) for s in seqs], None, normalized))

    def embed(self, tokens: List[int], normalized: bool = True) -> np.ndarray:
        return self.embed_batch([tokens], normalized)[0]

    def score_batch(self, seqs: Sequence[List[int]], token_types: Optional[Sequence[List[int]]] = None) -> List[float]:
        types = None if token_types is None else [list(t) for t in token_types]
        return self._submit(_Job("score", [list(s) for s in seqs], types, False))

    def _submit(self, job: _Job):
        self.embedder.check_inputs(job.seqs)   # bad input fails its own request, not those it would share with
        with self._lock:
            self._pending.append(job)
            lead = not self._running
            self._running = True
        if lead:
            self._drain()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _take(self) -> List[_Job]:
        """The next batch: the oldest job and those after it of the same kind, within the token budget."""
        with self._lock:
            if not self._pending:
                self._running = False
                return []
            first = self._pending[0]
            batch, rest, tokens = [], [], 0
            for job in self._pending:
                fits = not batch or tokens + job.n_tokens <= self.max_batch_tokens
                if job.key == first.key and fits:
                    batch.append(job)
                    tokens += job.n_tokens
                else:
                    rest.append(job)
            self._pending = rest
            return batch

    def _drain(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            seqs = [s for job in batch for s in job.seqs]
            try:
                self.batches += 1
                if batch[0].kind == "embed":
                    out = self.embedder.embed_batch(seqs, batch[0].normalized)
                else:
                    types = None if batch[0].types is None else [t for job in batch for t in job.types]
                    out = self.embedder.score_batch(seqs, types)
                start = 0
                for job in batch:
                    job.result = list(out[start:start + len(job.seqs)])
                    start += len(job.seqs)
            except BaseException as e:   # every caller of the batch hears of it
                for job in batch:
                    job.error = e
            for job in batch:
                job.done.set()
