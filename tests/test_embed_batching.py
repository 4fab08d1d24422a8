"""BatchingEmbedder: concurrent callers' inputs run in shared Embedder calls (fewer calls than requests), each
caller gets its own results in order, embeddings and scores are never mixed in one call, a bad request fails
alone, an error inside a shared call reaches each of its callers; and on a real encoder (tests/encoder_tiny.py)
concurrent requests give what one request each gives."""
import threading
import time

import numpy as np
import pytest

from ember.embed_batching import BatchingEmbedder


class SlowEmbedder:
    """An Embedder's interface: each call takes a while, so that callers pile up behind it."""

    n_ctx, pooling = 64, 1

    def __init__(self, fail_on=None):
        self.calls, self.fail_on = [], fail_on

    def check_inputs(self, seqs):
        for i, s in enumerate(seqs):
            if not s:
                raise ValueError(f"input {i} has no tokens")

    def embed_batch(self, seqs, normalized=True):
        self.calls.append(("embed", len(seqs)))
        time.sleep(0.05)
        if self.fail_on is not None and any(self.fail_on in s for s in seqs):
            raise RuntimeError("the forward failed")
        return [np.array([sum(s), len(s), float(normalized)], np.float32) for s in seqs]

    def score_batch(self, seqs, token_types=None):
        self.calls.append(("score", len(seqs)))
        time.sleep(0.05)
        return [float(sum(s)) + (0 if token_types is None else sum(map(sum, token_types))) for s in seqs]


def _concurrently(fns):
    out, errors = [None] * len(fns), [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except Exception as e:   # noqa: BLE001 (recorded for the test to check)
            errors[i] = e
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, errors


def test_concurrent_requests_share_calls(rng):
    inner = SlowEmbedder()
    b = BatchingEmbedder(inner)
    reqs = [[list(rng.integers(1, 100, size=rng.integers(1, 6))) for _ in range(rng.integers(1, 4))]
            for _ in range(12)]
    out, errors = _concurrently([lambda r=r: b.embed_batch(r) for r in reqs])
    assert errors == [None] * 12
    for r, got in zip(reqs, out):
        assert [list(v) for v in got] == [[sum(s), len(s), 1.0] for s in r]
    assert len(inner.calls) < 12 and b.batches == len(inner.calls)
    assert sum(n for _, n in inner.calls) == sum(map(len, reqs))
    assert b.n_ctx == 64 and b.pooling == 1   # the rest passes through


def test_kinds_and_options_are_never_mixed():
    inner = SlowEmbedder()
    b = BatchingEmbedder(inner)
    out, errors = _concurrently([lambda: b.embed_batch([[1, 2]]), lambda: b.score_batch([[3]], [[1]]),
                                 lambda: b.embed_batch([[4]], normalized=False), lambda: b.score_batch([[5, 6]])])
    assert errors == [None] * 4
    assert [list(v) for v in out[0]] == [[3, 2, 1.0]] and out[1] == [4.0]
    assert [list(v) for v in out[2]] == [[4, 1, 0.0]] and out[3] == [11.0]


def test_errors_reach_only_their_requests():
    inner = SlowEmbedder(fail_on=666)
    b = BatchingEmbedder(inner)
    out, errors = _concurrently([lambda: b.embed_batch([[1], []]), lambda: b.embed_batch([[2]])])
    assert isinstance(errors[0], ValueError) and "input 1 has no tokens" in str(errors[0]) and errors[1] is None
    out, errors = _concurrently([lambda: b.embed_batch([[666]]), lambda: b.embed_batch([[7]])])
    assert isinstance(errors[0], RuntimeError)
    # Afterwards the queue still works (no caller is left leading or waiting).
    assert [list(v) for v in b.embed_batch([[1, 1]])] == [[2, 2, 1.0]]


def test_token_budget_splits_batches():
    inner = SlowEmbedder()
    b = BatchingEmbedder(inner, max_batch_tokens=4)
    out, errors = _concurrently([lambda i=i: b.embed_batch([[i] * 3]) for i in range(1, 6)])
    assert errors == [None] * 5 and all(n == 1 for _, n in inner.calls)


def test_on_a_real_encoder(tmp_path):
    pytest.importorskip("gguf")
    import encoder_tiny

    from ember import _ember
    from ember.convert import convert
    from ember.embedding import Embedder
    encoder_tiny.build("bert", str(tmp_path / "bert"))
    path = str(tmp_path / "bert.gguf")
    convert(str(tmp_path / "bert"), path, "f32", progress=False)
    emb = Embedder(_ember.Model(path), 64, n_threads=2)
    seqs = encoder_tiny.SEQS
    want = [emb.embed_batch([s])[0] for s in seqs]
    b = BatchingEmbedder(emb)
    out, errors = _concurrently([lambda s=s: b.embed_batch([s]) for s in seqs * 3])
    assert errors == [None] * len(out)
    for got, w in zip(out, want * 3):
        assert np.abs(got[0] - w).max() <= 1e-5


# ---- beside a decoding engine: embeddings take at most their share of the time


def _timed_requests(b, n):
    t0 = time.monotonic()
    for i in range(n):
        b.embed_batch([[i + 1, 2, 3]])
    return time.monotonic() - t0


def test_while_the_engine_decodes_embeddings_keep_to_their_share():
    """Each 50 ms call earns a pause of 50 ms * (1 - share) / share before the next one starts."""
    b = BatchingEmbedder(SlowEmbedder(), busy=lambda: True, share=0.25)
    took = _timed_requests(b, 3)
    assert took >= 3 * 0.05 + 2 * 0.15 - 0.02, took


def test_an_idle_engine_leaves_embeddings_unpaused():
    assert _timed_requests(BatchingEmbedder(SlowEmbedder(), busy=lambda: False, share=0.25), 3) < 0.3
    assert _timed_requests(BatchingEmbedder(SlowEmbedder(), busy=lambda: True, share=1.0), 3) < 0.3


def test_a_pause_lasts_at_most_its_bound():
    """However small the share, embeddings are answered at least every BUSY_PAUSE_MAX_S while the
    engine decodes (a share of 0.001 would earn 50 s after a 50 ms call)."""
    from ember.embed_batching import BUSY_PAUSE_MAX_S
    took = _timed_requests(BatchingEmbedder(SlowEmbedder(), busy=lambda: True, share=0.001), 3)
    assert took < 3 * 0.05 + 2 * BUSY_PAUSE_MAX_S + 0.2, took


def test_a_pause_ends_when_decoding_ends():
    """A pause of about 5 s (share 0.01) is cut short once the engine has nothing left to decode."""
    until = time.monotonic() + 0.2
    b = BatchingEmbedder(SlowEmbedder(), busy=lambda: time.monotonic() < until, share=0.01)
    assert _timed_requests(b, 2) < 1.0


def test_while_the_engine_decodes_batches_stay_small(rng):
    from ember import embed_batching

    inner = SlowEmbedder()
    b = BatchingEmbedder(inner, busy=lambda: True, share=1.0 - 1e-9)
    seq = list(rng.integers(1, 100, size=100))
    out, errors = _concurrently([lambda: b.embed_batch([seq])] * 12)
    assert errors == [None] * 12 and len(out) == 12
    assert max(n for _, n in inner.calls) * len(seq) <= embed_batching.BUSY_BATCH_TOKENS


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_share_must_be_a_fraction(share):
    with pytest.raises(ValueError, match="share must be in"):
        BatchingEmbedder(SlowEmbedder(), share=share)
