"""Many requests' inputs in shared forwards: a BatchingEmbedder queues what concurrent callers ask of one Embedder
and runs everything queued at once (an encoder packs those sequences into few forwards), so a server answering
many small /v1/embeddings or /v1/rerank requests pays for few forwards. The first caller to find no batch running
runs batches until the queue is empty; the others wait for their results.

Beside an engine that generates on the same CPU, embedding forwards take cores from its decode steps. While
busy() says it decodes, batches are kept small and each is followed by a pause, so that embeddings hold at
most BUSY_SHARE of the time and decode keeps most of its rate, while embeddings are still answered (a pause
lasts at most BUSY_PAUSE_MAX_S)."""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional, Sequence

import numpy as np

from .embedding import Embedder

MAX_BATCH_TOKENS = 16384   # bounds one batch's activations; a single larger request still runs alone
BUSY_BATCH_TOKENS = 512    # the bound while the engine decodes: short forwards, so the pauses come often
BUSY_SHARE = 0.1           # the share of the time embeddings may take while the engine decodes (1: no limit)
# The longest pause one batch earns: where contention makes a batch slow, embeddings are still answered
# about this often rather than once in ten of its durations.
BUSY_PAUSE_MAX_S = 0.5
_POLL_S = 0.005            # how often a pause checks whether the engine still decodes


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
    through). batches counts the Embedder calls made. busy: whether an engine on the same cores is
    decoding now (None: there is none); share: the time embeddings may take meanwhile (None: BUSY_SHARE,
    read at each batch)."""

    def __init__(self, embedder: Embedder, max_batch_tokens: int = MAX_BATCH_TOKENS,
                 busy: Optional[Callable[[], bool]] = None, share: Optional[float] = None):
        self.embedder = embedder
        self.max_batch_tokens = max_batch_tokens
        self.busy = busy
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._share = share
        self.batches = 0
        self._lock = threading.Lock()
        self._pending: List[_Job] = []
        self._running = False
        self._resume_at = 0.0   # while the engine decodes, no batch starts before this (time.monotonic)

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

    @property
    def share(self) -> float:
        """The share of the time embeddings may take while the engine decodes (BUSY_SHARE unless given)."""
        return BUSY_SHARE if self._share is None else self._share

    def _yielding(self) -> bool:
        return self.busy is not None and self.share < 1 and self.busy()

    def _pause(self) -> None:
        """Waits out the pause the last batch earned while the engine still decodes."""
        while time.monotonic() < self._resume_at and self._yielding():
            time.sleep(min(_POLL_S, max(0.0, self._resume_at - time.monotonic())))

    def _take(self, yielding: bool) -> List[_Job]:
        """The next batch: the oldest job and those after it of the same kind, within the token budget."""
        budget = min(self.max_batch_tokens, BUSY_BATCH_TOKENS) if yielding else self.max_batch_tokens
        with self._lock:
            if not self._pending:
                self._running = False
                return []
            first = self._pending[0]
            batch, rest, tokens = [], [], 0
            for job in self._pending:
                fits = not batch or tokens + job.n_tokens <= budget
                if job.key == first.key and fits:
                    batch.append(job)
                    tokens += job.n_tokens
                else:
                    rest.append(job)
            self._pending = rest
            return batch

    def _drain(self) -> None:
        while True:
            # Nothing queued: return now (the last caller has its result); the pause is the next
            # batch's to wait out, whoever runs it.
            with self._lock:
                if not self._pending:
                    self._running = False
                    return
            self._pause()
            yielding = self._yielding()
            batch = self._take(yielding)
            if not batch:
                return
            seqs = [s for job in batch for s in job.seqs]
            t0 = time.monotonic()
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
            if yielding:
                took = time.monotonic() - t0
                self._resume_at = time.monotonic() + min(took * (1 - self.share) / self.share, BUSY_PAUSE_MAX_S)
            for job in batch:
                job.done.set()
