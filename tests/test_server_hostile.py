"""ember-server under hostile input (issue 45): every client error a 4xx naming the field before
anything is queued, a JSON 500 without internals that keeps the connection, no request stalling
/health, bounded chat templates, --timeout on slow clients, the connection limit, a client that
stops reading losing its generation, JSON-only bodies, CORS, HEAD, and the graceful drain of the
`ember-server` command on SIGTERM."""
import asyncio
import contextlib
import gc
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from ember import LLM, AsyncLLMEngine, SamplingParams
from ember.chat import template
from ember.chat.template import ChatTemplate, TemplateBudgetError
from ember.server import app as server_app
from ember.server.app import create_app
from ember.server.args import ServerSettings
from ember.server.serving import make_server

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with LLM(smollm2_path, n_ctx=512, n_threads=2, max_num_seqs=4) as llm:
        engine = AsyncLLMEngine.from_llm(llm)
        yield engine
        engine.shutdown()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine)) as c:
        yield c


def idle(engine, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def live_server(app, **kwargs):
    """app on ember-server's own uvicorn server (serving.make_server) on a free port: (host, port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = make_server(app, log_level="warning", **kwargs)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield sock.getsockname()
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def raw_post(client, path, text: str):
    return client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


# ---- client errors: 4xx naming the field --------------------------------------------------
@pytest.mark.parametrize("path, text, param", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud800"}]}', "messages[0].content"),
    ("/v1/completions", '{"prompt": "x", "model": "\\udfff"}', "model"),
    ("/v1/completions", '{"prompt": ["ok", "\\ud800x"]}', "prompt[1]"),
    ("/v1/completions", '{"prompt": "x", "stop": ["\\ud800"]}', "stop[0]"),
    ("/v1/embeddings", '{"input": "\\ud83d"}', "input"),
    ("/tokenize", '{"content": "\\ud800"}', "content"),
    ("/v1/completions", '{"prompt": "x", "top_k": 2147483648}', "top_k"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 9223372036854775808}', "max_tokens"),
    ("/v1/completions", '{"prompt": "x", "seed": 18446744073709551616}', "seed"),
    ("/v1/completions", '{"prompt": "x", "temperature": 1e300}', "temperature"),
    ("/v1/completions", '{"prompt": "x", "top_p": 1e-300}', "top_p"),
    ("/v1/completions", '{"prompt": "x", "repetition_penalty": 1e300}', "repetition_penalty"),
    ("/v1/completions", '{"prompt": "x", "temperature": 1e400}', "temperature"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": 1}}',
     "chat_template_kwargs"),
])
def test_hostile_fields_are_400s_naming_the_field(client, engine, path, text, param):
    assert_error(raw_post(client, path, text), 400, param)
    assert idle(engine)   # refused before anything was queued


@pytest.mark.parametrize("text", [
    "[" * 1000 + "]" * 1000,
    '{"prompt": "x", "n": ' + "9" * 5000 + "}",
    '{"prompt": "x", "temperature": NaN}',
    '{"prompt": "x", "a": ' + '{"b": ' * 100 + "1" + "}" * 101,
    b'{"prompt": "\xff"}'.decode("latin-1"),
])
def test_hostile_bodies_are_400s(client, text):
    assert_error(client.post("/v1/completions", content=text.encode("latin-1"),
                             headers={"Content-Type": "application/json"}), 400)


def test_top_k_past_int32_streamed_is_a_400_not_a_cut_stream(client):
    r = client.post("/v1/completions", json={"prompt": "x", "top_k": 1 << 31, "stream": True})
    assert_error(r, 400, "top_k")


def test_json_only(client):
    assert_error(client.post("/v1/completions", content=b'{"prompt": "x"}', headers={"Content-Type": "text/plain"}),
                 415, code="unsupported_media_type")
    assert_error(client.post("/tokenize", data={"content": "x"}), 415)   # a form, as any web page may post
    assert_error(client.post("/v1/completions", content=b'{"prompt": "x"}'), 415)
    r = client.post("/tokenize", content=b'{"content": "x"}',
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_head_models_and_no_paths(client, smollm2_path):
    r = client.head("/health")
    assert r.status_code == 200 and r.content == b""
    assert client.head("/v1/models").status_code == 200
    models = client.get("/v1/models")
    assert os.path.dirname(smollm2_path) not in models.text and "/" not in json.dumps(models.json()["data"][0]["meta"])


def test_cors_is_off_unless_an_origin_is_allowed(engine):
    with TestClient(create_app(engine)) as c:
        r = c.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
    app = create_app(engine, ServerSettings(cors_origins=("https://app.example",)))
    with TestClient(app) as c:
        ok = c.options("/v1/completions", headers={"Origin": "https://app.example",
                                                   "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "content-type"})
        assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in ok.headers["access-control-allow-methods"]
        r = c.post("/tokenize", json={"content": "x"}, headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        other = c.post("/tokenize", json={"content": "x"}, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


# ---- server errors ---------------------------------------------------------------------------
def test_a_server_error_is_json_without_internals_and_keeps_the_connection(engine, monkeypatch, caplog):
    def broken(tok, body):
        raise KeyError("/secret/path/inside/the/server")
    monkeypatch.setattr(server_app, "_detokenize", broken)
    with live_server(create_app(engine)) as (host, port):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        with caplog.at_level("INFO", logger="ember.server"):
            for _ in range(3):   # the same keep-alive connection every time
                conn.request("POST", "/detokenize", body=b'{"tokens": [1]}',
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                body = r.read()
                assert r.status == 500 and r.getheader("connection") != "close"
                assert b"secret" not in body and json.loads(body)["error"]["type"] == "server_error"
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
        conn.close()
    lines = [r for r in caplog.records if "/detokenize" in r.getMessage()]
    assert len(lines) == 3 and all('" 500 ' in r.getMessage() and r.exc_info is None for r in lines)


# ---- nothing stalls the event loop ------------------------------------------------------------
def health_latencies(host, port, stop: threading.Event, out: list):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        out.append((time.perf_counter() - t0, r.status))
        time.sleep(0.02)
    conn.close()


SLOW_TEMPLATE = ("{% for i in range(1500) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
                 "{% for m in messages %}{{ m.content }}{% endfor %}")
SPECIALS = ("<|im_start|>" + "y" * 20) * (2 << 20 >> 5)   # the 2 MiB of special tokens
# Tokenizing is linear now, so 2 MiB can take under 0.3 s on a quiet machine: the stall test sends 6 MiB (the
# body limit is 8 MiB) so that its request stays slow enough for /health to be asked several times meanwhile.
STALL_SPECIALS = SPECIALS * 3


@pytest.fixture(scope="module")
def slow_template_server(smollm2_path, tmp_path_factory):
    """The `ember-server` command (its own process, as in production), with a template that loops
    for a second or two."""
    slow = tmp_path_factory.mktemp("templates") / "slow.jinja"
    slow.write_text(SLOW_TEMPLATE)
    proc, url = start_server(smollm2_path, "--chat-template", str(slow))
    yield url
    proc.terminate()
    proc.wait(30)
    proc.stderr.close()


@pytest.mark.parametrize("path, body", [
    ("/tokenize", {"content": STALL_SPECIALS, "with_pieces": True}),
    ("/v1/completions", {"prompt": STALL_SPECIALS, "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}),
], ids=["tokenize-pieces", "completion-tokenizing", "chat-template"])
def test_health_answers_while_a_slow_request_runs(slow_template_server, path, body):
    host, port = slow_template_server.removeprefix("http://").split(":")
    # A full collection now, not inside the short window measured: late in a whole-suite run the heap
    # is large and one collection alone takes about the bound.
    gc.collect()
    latencies, stop = [], threading.Event()
    prober = threading.Thread(target=health_latencies, args=(host, int(port), stop, latencies))
    prober.start()
    time.sleep(0.2)
    n_before = len(latencies)
    t0 = time.perf_counter()
    r = httpx.post(slow_template_server + path, json=body, timeout=120)
    took = time.perf_counter() - t0
    stop.set()
    prober.join()
    assert r.status_code in (200, 400), r.text   # (3 MiB of tokens are past the context: a 400)
    during = [seconds for seconds, status in latencies[n_before:]]
    assert took > 0.2 and len(during) > 3, (took, len(during))   # the request was slow, /health was asked
    assert all(status == 200 for _, status in latencies)
    # The bound, 100 ms, for nine probes of ten; the rest may meet a garbage collection or,
    # on a shared machine, another process on the core, but never the request's whole time.
    p90 = sorted(during)[int(0.9 * len(during))]
    assert p90 < 0.1 and max(during) < 0.5, \
        f"/health took {p90 * 1e3:.0f} ms (p90), up to {max(during) * 1e3:.0f} ms while {path} ran {took:.1f} s"


# ---- bounded templates -------------------------------------------------------------------------
@pytest.mark.parametrize("source, what", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran for more than"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "wrote more than"),
    ("{{ 'x' * 10**10 }}", "repeats"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
])
def test_template_budgets(source, what):
    t = ChatTemplate(source, origin="evil.jinja", budget_s=0.5, budget_chars=10_000_000)
    t0 = time.perf_counter()
    with pytest.raises(TemplateBudgetError, match=what) as e:
        t.render(CHAT)
    assert "evil.jinja" in str(e.value) and time.perf_counter() - t0 < 3


def test_a_runaway_template_is_a_500_naming_it(engine, tmp_path, monkeypatch):
    f = tmp_path / "loop.jinja"
    f.write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    monkeypatch.setattr(template, "RENDER_SECONDS", 0.3)
    with TestClient(create_app(engine, ServerSettings(chat_template=str(f)))) as c:
        err = assert_error(c.post("/v1/chat/completions", json={"messages": CHAT}), 500, code="chat_template_budget")
        assert "loop.jinja" in err["message"]
        assert c.get("/health").status_code == 200


# ---- connections -------------------------------------------------------------------------------
def closed_by_server(sock, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass   # a 408 may come first
        return True
    except (TimeoutError, socket.timeout):
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_and_slow_bodies_are_closed_after_timeout(engine):
    with live_server(create_app(engine, ServerSettings(timeout=1.0)), timeout=1.0) as (host, port):
        idle_socks = [socket.create_connection((host, port)) for _ in range(256)]
        slow_headers = [socket.create_connection((host, port)) for _ in range(10)]
        for s in slow_headers:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        slow_bodies = [socket.create_connection((host, port)) for _ in range(50)]
        for s in slow_bodies:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        t0 = time.monotonic()
        assert all(closed_by_server(s, 5) for s in idle_socks + slow_headers + slow_bodies)
        assert time.monotonic() - t0 < 8
        for s in idle_socks + slow_headers + slow_bodies:
            s.close()
        assert httpx.get(f"http://{host}:{port}/health").status_code == 200


def test_connection_limit(engine):
    with live_server(create_app(engine), max_connections=8) as (host, port):
        socks = [socket.create_connection((host, port)) for _ in range(8)]
        time.sleep(0.2)
        extra = socket.create_connection((host, port))
        extra.settimeout(5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        for s in socks + [extra]:
            s.close()
        time.sleep(0.2)
        assert httpx.get(f"http://{host}:{port}/health").status_code == 200


def test_a_client_that_stops_reading_loses_its_generation(engine):
    """A send the client never takes (its buffers full) ends the response after --timeout, and
    closing the stream cancels the engine request."""
    app = create_app(engine, ServerSettings(timeout=0.5))
    body = json.dumps({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()

    async def run():
        sent, hang = [], asyncio.Event()

        async def receive():
            if not sent:
                sent.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            await hang.wait()

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                await hang.wait()   # a client that reads nothing more

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")], "client": ("t", 1),
                 "server": ("t", 80), "scheme": "http", "root_path": "", "http_version": "1.1",
                 "asgi": {"version": "3.0", "spec_version": "2.3"}}
        t0 = time.monotonic()
        await asyncio.wait_for(app(scope, receive, send), 10)
        return time.monotonic() - t0

    with TestClient(app):   # runs the lifespan
        took = asyncio.run(run())
    assert took < 5
    assert idle(engine)


def test_events_of_a_closed_loop_cancel_their_request(engine):
    async def start():
        gen = engine.generate([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True))
        await gen.__anext__()
        return gen
    loop = asyncio.new_event_loop()
    gen = loop.run_until_complete(start())
    loop.close()   # the generator is never closed: the engine must notice
    assert idle(engine)
    del gen


# ---- the command's drain ---------------------------------------------------------------------
def start_server(smollm2_path, *flags):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "ember.server", "-m", smollm2_path, "-c", "512", "-t", "2",
                             "-np", "4", "--port", str(port), *flags], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None and time.monotonic() < deadline
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def read_stream(url, results, i, started):
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    chunks, done = [], False
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
                started.release()
    results[i] = (r.status_code, chunks, done, time.monotonic())


def test_sigterm_drains_16_streams(smollm2_path):
    proc, url = start_server(smollm2_path, "--shutdown-timeout", "2")
    try:
        results, started = {}, threading.Semaphore(0)
        threads = [threading.Thread(target=read_stream, args=(url, results, i, started)) for i in range(16)]
        for t in threads:
            t.start()
        for _ in range(4):   # the 4 running streams have begun; 12 wait for a slot
            assert started.acquire(timeout=30)
        waiting = {}
        late = threading.Thread(target=lambda: waiting.update(r=httpx.post(
            url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}, timeout=60)))
        late.start()
        time.sleep(0.3)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        late.join(30)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert len(results) == 16, err
    for status, chunks, done, t_end in results.values():
        assert status == 200 and done, err
        reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert reasons[-1] in ("length", "abort"), reasons[-3:]
        assert t_end - t_term < 2 + 3
    assert sum(1 for _, chunks, _, _ in results.values()
               if chunks[-1]["choices"][0]["finish_reason"] == "abort") >= 12
    assert_error(waiting["r"], 503, code="shutting_down")
    assert proc.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), err


def test_a_second_signal_exits_at_once(smollm2_path):
    proc, url = start_server(smollm2_path, "--shutdown-timeout", "60")
    try:
        started = threading.Semaphore(0)
        def cut_short():
            with contextlib.suppress(httpx.TransportError):   # the server exits mid-stream
                read_stream(url, {}, 0, started)
        t = threading.Thread(target=cut_short, daemon=True)
        t.start()
        assert started.acquire(timeout=30)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None   # draining: the stream may run for 60 s
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def test_a_closed_llama_raises_value_error_everywhere(smollm2_path):
    from ember import Llama
    llm = Llama(smollm2_path, n_ctx=64, n_threads=2, verbose=False)
    llm.close()
    for call in (lambda: llm.create_chat_completion(CHAT), lambda: llm.create_completion(PROMPT),
                 lambda: llm.tokenize(b"x"), lambda: llm.n_ctx()):
        with pytest.raises(ValueError, match="closed"):
            call()
