"""Mixed load on one ember-server: the decode rate of N concurrent completions alone, then while another
client asks for embeddings without a break, with the embeddings yielding to decode (embed_batching's
BUSY_SHARE) and, for comparison, without (share 1); the embedding requests answered meanwhile. The three
runs are interleaved, repeats times, and the medians reported.

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python:tests python tools/bench_mixed_load.py [MODEL.gguf] \
        [--streams 16] [--tokens 64] [--threads 2] [--repeats 3]

The model defaults to the tests' SmolLM2 (tests/conftest.py), which chats and embeds (mean pooling)."""
import argparse
import json
import socket
import statistics
import threading
import time
import urllib.request

import uvicorn

from ember import LLM, AsyncLLMEngine, embed_batching
from ember.server.app import create_app
from ember.server.args import ServerSettings


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def decode_rate(url, streams, tokens):
    """Completion tokens per second of `streams` concurrent greedy completions of `tokens` tokens."""
    out = [None] * streams

    def one(i):
        out[i] = post(url + "/v1/completions", {"prompt": f"Story {i}:", "max_tokens": tokens, "ignore_eos": True,
                                                "temperature": 0})
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r["usage"]["completion_tokens"] for r in out) / (time.perf_counter() - t0)


def with_embeddings(url, streams, tokens):
    """The decode rate while a client embeds 4 sentences a request, one request after another."""
    stop, answered = threading.Event(), [0]

    def embed():
        while not stop.is_set():
            post(url + "/v1/embeddings", {"input": ["The quick brown fox jumps over the lazy dog."] * 4})
            answered[0] += 1
    client = threading.Thread(target=embed)
    client.start()
    try:
        return decode_rate(url, streams, tokens), answered[0]
    finally:
        stop.set()
        client.join()


def serve(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args(argv)
    if a.model is None:
        import conftest
        a.model = str(conftest._fetch_smollm2())
    with LLM(a.model, n_ctx=256, n_threads=a.threads, max_num_seqs=a.streams) as llm:
        server, thread, url = serve(create_app(AsyncLLMEngine.from_llm(llm), ServerSettings(pooling="mean")))
        try:
            post(url + "/v1/embeddings", {"input": "warm up"})
            shares = (embed_batching.BUSY_SHARE, 1.0)
            alone, rates, answered = [], {x: [] for x in shares}, {x: [] for x in shares}
            for _ in range(a.repeats):
                alone.append(decode_rate(url, a.streams, a.tokens))
                for share in shares:
                    embed_batching.BUSY_SHARE = share   # the server's embedder reads it at each batch
                    rate, n = with_embeddings(url, a.streams, a.tokens)
                    rates[share].append(rate)
                    answered[share].append(n)
        finally:
            server.should_exit = True
            thread.join(10)
    base = statistics.median(alone)
    print(f"{a.streams} streams x {a.tokens} tokens, {a.threads} threads, {a.repeats} interleaved repeats: "
          f"decode alone {base:.1f} tok/s (runs {[round(r) for r in alone]})")
    for share in shares:
        rate = statistics.median(rates[share])
        print(f"  with embeddings, share {share:g}: {rate:.1f} tok/s ({rate / base:.2f} of alone; runs "
              f"{[round(r) for r in rates[share]]}), embedding requests of 4 inputs answered meanwhile "
              f"{answered[share]}")


if __name__ == "__main__":
    main()
