"""ember-server under mixed load: while chat streams decode, /v1/embeddings keeps answering (the embedder runs in
a worker thread beside the engine's loop), the streams finish whole, and the embeddings equal those of an idle
server; an embedding request's inputs are embedded as one batch."""
import json
import threading
import time
import urllib.request

import numpy as np
import pytest

from test_server import live_server

pytest.importorskip("fastapi")

N_STREAMS, MAX_TOKENS = 4, 128   # streams long enough for several bounded pauses (BUSY_PAUSE_MAX_S)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Embeddings map text to vectors.", "Bonjour à tous!"]


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _stream(url, prompt, out, i):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    tokens, first = 0, None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                first = first or time.perf_counter()
                tokens = (json.loads(line[len("data: "):]).get("usage") or {}).get("completion_tokens", tokens)
    out[i] = (tokens, first, time.perf_counter())


def test_embeddings_answer_while_chats_stream(smollm2_path):
    from ember import LLM, AsyncLLMEngine
    from ember.server.app import create_app
    from ember.server.args import ServerSettings
    with LLM(smollm2_path, n_ctx=256, n_threads=2, max_num_seqs=N_STREAMS) as llm:
        app = create_app(AsyncLLMEngine.from_llm(llm), ServerSettings(pooling="mean"))
        with live_server(app) as url:
            idle = _post(url + "/v1/embeddings", {"input": TEXTS})
            results = [None] * N_STREAMS
            threads = [threading.Thread(target=_stream, args=(url, f"Story {i}: once upon a time", results, i))
                       for i in range(N_STREAMS)]
            for t in threads:
                t.start()
            answered = []
            while any(t.is_alive() for t in threads):
                body = _post(url + "/v1/embeddings", {"input": TEXTS})
                answered.append((time.perf_counter(), body))
            for t in threads:
                t.join()
    assert all(r is not None and r[0] == MAX_TOKENS for r in results), results
    last_end = min(r[2] for r in results)
    during = [b for when, b in answered if when < last_end]
    assert len(during) >= 2, f"only {len(during)} embedding requests answered while {N_STREAMS} chats streamed"
    want = np.array([d["embedding"] for d in idle["data"]])
    for body in during:
        got = np.array([d["embedding"] for d in body["data"]])
        assert np.allclose(got, want, atol=1e-5)
