"""ember-server under load: the `ember-server` command on SmolLM2 (its own process, as deployed)
takes 64 streaming clients at once, every one getting the tokens it asked for; then 64 more, of
which half hang up mid-stream, and the server ends with nothing running or waiting and every KV
block back in the pool. Clients are threads on http.client, reading the SSE stream by hand."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

CLIENTS = 64
TOKENS = 16     # each finishing client's max_tokens (end of generation ignored)
LONG = 400      # a client that hangs up asks for this many, so it is still running when it leaves


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    """(port, path of the server's log): `ember-server` with 64 sequences at once."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "ember-server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ember.server", "-m", smollm2_path, "-c", "512", "-t", "2",
                                 "-np", str(CLIENTS), "--port", str(port)], stderr=log, stdout=log,
                                env=dict(os.environ, EMBER_API_KEY=""))

    def healthy():
        assert proc.poll() is None, f"ember-server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
        try:
            return get(port, "/health")[0] == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 60, "ember-server to load the model")
        yield port, log_path
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def metrics(port) -> dict:
    status, text = get(port, "/metrics")
    assert status == 200
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


def stream_completion(port, i, max_tokens, hang_up_after=None) -> dict:
    """One streamed /v1/completions request. Returns its status, the tokens the chunks carried
    (counted by their logprobs, one entry per token, whatever the chunking), the usage, the
    finish reasons, error events and whether [DONE] came; hang_up_after=k closes the connection
    after k chunks."""
    body = {"prompt": f"Story number {i}: once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.8, "seed": i, "logprobs": 0, "stream": True, "stream_options": {"include_usage": True}}
    result = {"status": None, "tokens": 0, "usage": None, "finish": [], "errors": [], "done": False}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        result["status"] = r.status
        chunks = 0
        for raw in r:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                result["done"] = True
                break
            event = json.loads(line[len("data: "):])
            if "error" in event:
                result["errors"].append(event["error"])
                continue
            for choice in event["choices"]:
                result["tokens"] += len((choice["logprobs"] or {"tokens": []})["tokens"])
                if choice["finish_reason"] is not None:
                    result["finish"].append(choice["finish_reason"])
            if event.get("usage"):
                result["usage"] = event["usage"]
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                break
    finally:
        conn.close()
    return result


def run_clients(port, jobs) -> list:
    """jobs: (max_tokens, hang_up_after) per client, all started at once; their results."""
    results = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def one(i, max_tokens, hang_up_after):
        start.wait()
        try:
            results[i] = stream_completion(port, i, max_tokens, hang_up_after)
        except Exception as e:   # the assertion below names it
            results[i] = {"status": None, "exception": repr(e)}

    threads = [threading.Thread(target=one, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a client never finished"
    return results


def request_log(log_path) -> list:
    return [line for line in log_path.read_text().splitlines() if '"POST /v1/completions"' in line]


def test_concurrent_streams_get_their_tokens(server):
    port, log_path = server
    logged = len(request_log(log_path))
    t0 = time.monotonic()
    results = run_clients(port, [(TOKENS, None)] * CLIENTS)
    print(f"{CLIENTS} streams of {TOKENS} tokens: {time.monotonic() - t0:.1f} s")
    for i, r in enumerate(results):
        assert r["status"] == 200 and r["done"] and not r["errors"], (i, r)
        assert r["tokens"] == TOKENS and r["usage"]["completion_tokens"] == TOKENS, (i, r)
        assert r["finish"] == ["length"], (i, r)
    # One log line per request, with its token counts.
    wait_for(lambda: len(request_log(log_path)) == logged + CLIENTS, 10, "a log line per request")
    assert all(" length prompt=" in line and f"completion={TOKENS}" in line
               for line in request_log(log_path)[logged:])


def test_hang_ups_free_everything(server):
    """Half of 64 clients hang up after two chunks, while their requests still have hundreds of
    tokens to go; the other half finish beside them. Afterwards nothing runs or waits and every
    KV block is free (cached for the prefix cache is fine)."""
    port, log_path = server
    logged = len(request_log(log_path))
    disconnected = metrics(port).get('ember:requests_total{outcome="disconnected"}', 0)
    t0 = time.monotonic()
    results = run_clients(port, [(LONG, 2) if i % 2 else (TOKENS, None) for i in range(CLIENTS)])
    print(f"{CLIENTS // 2} streams finishing beside {CLIENTS // 2} hanging up: {time.monotonic() - t0:.1f} s")
    for i, r in enumerate(results):
        assert r["status"] == 200 and not r["errors"], (i, r)
        if not i % 2:
            assert r["done"] and r["tokens"] == TOKENS and r["usage"]["completion_tokens"] == TOKENS, (i, r)

    def settled():
        m = metrics(port)
        return (m["ember:num_requests_running"] == 0 and m["ember:num_requests_waiting"] == 0
                and m["ember:kv_blocks_used"] == 0
                and m.get('ember:requests_total{outcome="disconnected"}') == disconnected + CLIENTS // 2)
    wait_for(settled, 30, "the server to cancel the hung-up requests and free their KV blocks")
    assert metrics(port)["ember:kv_blocks_total"] > 0
    wait_for(lambda: len(request_log(log_path)) == logged + CLIENTS, 10, "a log line per request")
    assert sum(" disconnected" in line for line in request_log(log_path)[logged:]) == CLIENTS // 2
