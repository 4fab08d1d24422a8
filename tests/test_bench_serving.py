"""`ember-bench --serving` (ember.bench_serving): against ember-server on SmolLM2 its counts add up
(requests, prompt and output tokens, as the server itself counts them); against a stub server
that sends no usage it counts the text chunks, and it reports failed requests; bad URLs, keys and
arguments end in one clear line and a nonzero status."""
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ember import LLM, AsyncLLMEngine
from ember import bench_serving
from ember.prompt import encode_prompt
from ember.server.app import create_app
from ember.server.args import ServerSettings
from test_server import live_server

SMALL = ["-n", "6", "-c", "3", "--prompt-words", "5-30", "--output-tokens", "3-10", "--seed", "5"]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with LLM(smollm2_path, n_ctx=512, n_threads=2, max_num_seqs=4) as llm:
        engine = AsyncLLMEngine.from_llm(llm)
        yield engine
        engine.shutdown()


def bench(argv, capsys):
    """(exit status, stdout, stderr) of ember-bench --serving in this process."""
    status = bench_serving.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_counts_add_up_against_ember_server(engine, tmp_path, capsys):
    before = engine.stats()
    with live_server(create_app(engine)) as url:
        status, out, err = bench(["--serving", url, *SMALL, "--json", str(tmp_path / "r.json")], capsys)
    assert status == 0, err
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    asked = bench_serving.make_requests(6, (5, 30), (3, 10), 5)
    assert summary["requests_ok"] == 6 and summary["requests_failed"] == 0 and summary["requests_short"] == 0
    assert summary["output_tokens"] == sum(r.max_tokens for r in asked)
    assert summary["prompt_tokens"] == sum(len(encode_prompt(engine.tokenizer, r.prompt)) for r in asked)
    after = engine.stats()
    assert after["generation_tokens"] - before["generation_tokens"] == summary["output_tokens"]
    duration = summary["duration_s"]
    assert summary["output_tokens_per_s"] == pytest.approx(summary["output_tokens"] / duration)
    total = summary["output_tokens"] + summary["prompt_tokens"]
    assert summary["total_tokens_per_s"] == pytest.approx(total / duration)
    assert summary["requests_per_s"] == pytest.approx(6 / duration)
    assert 0 < summary["ttft_ms_p50"] <= summary["ttft_ms_p99"] < duration * 1e3
    assert 0 < summary["itl_ms_p50"] <= summary["itl_ms_p99"]
    assert "| requests ok | 6 |" in out and f"| output tokens | {summary['output_tokens']} |" in out
    for row in ("duration (s)", "output tokens/s", "total tokens/s", "requests/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
                "ITL p50 (ms)", "ITL p99 (ms)"):
        assert f"| {row} | " in out


def test_the_ember_bench_command(engine):
    """`ember-bench --serving` reaches bench_serving; the file also runs on its own."""
    with live_server(create_app(engine)) as url:
        for command in ([sys.executable, "-m", "ember.bench"], [sys.executable, bench_serving.__file__]):
            r = subprocess.run([*command, "--serving", url + "/v1", "-n", "2", "-c", "2", "--prompt-words", "3",
                                "--output-tokens", "2"], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            assert "| requests ok | 2 |" in r.stdout and "| output tokens | 4 |" in r.stdout


def test_model_and_api_key(engine, capsys):
    with live_server(create_app(engine, ServerSettings(api_key="k", alias="smol"))) as url:
        status, _, err = bench(["--serving", url, *SMALL], capsys)
        assert status == 1 and err.strip().splitlines()[-1].startswith("ember-bench: error: ")
        assert "refused the API key (401)" in err
        status, out, err = bench(["--serving", url, *SMALL, "--api-key", "k", "--model", "smol"], capsys)
        assert status == 0 and "| requests ok | 6 |" in out, err
        status, out, err = bench(["--serving", url, *SMALL, "--api-key", "k", "--model", "gpt-4"], capsys)
        assert status == 1 and "| requests failed | 6 |" in out
        assert "6 of 6 requests failed; the first: HTTP 404: The model 'gpt-4' does not exist" in err


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-like server with no usage and no /v1/models: every third request fails, the
    others stream five text chunks (and an empty one), then [DONE]."""
    calls = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            type(self).calls += 1
            call = self.calls
        if call % 3 == 0:
            payload = json.dumps({"error": {"message": "boom", "type": "server_error"}}).encode()
            self.send_response(500)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        assert body["stream"] and body["ignore_eos"] and "model" not in body
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in ("a", "b", "", "c", "d", "e"):
            self.wfile.write(f"data:{json.dumps({'choices': [{'index': 0, 'text': text}]})}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"data: [DONE]\n\n")


def test_a_server_without_usage_and_failures(capsys):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        status, out, err = bench(["--serving", url, "-n", "9", "-c", "3", "--output-tokens", "5"], capsys)
    finally:
        server.shutdown()
        server.server_close()
    assert status == 1
    assert "| requests ok | 6 |" in out and "| requests failed | 3 |" in out
    assert "| output tokens | 30 |" in out   # counted as the chunks with text
    assert "| prompt tokens | n/a |" in out and "| total tokens/s | n/a |" in out
    assert err.strip().splitlines()[-1] == "ember-bench: error: 3 of 9 requests failed; the first: HTTP 500: boom"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, status, message", [
    (["--serving", f"http://127.0.0.1:{free_port()}"], 1, "ember-bench: error: cannot reach http://127.0.0.1:"),
    (["--serving", "localhost:8080"], 1, "ember-bench: error: the URL must look like http://HOST:PORT"),
    (["--serving", "http://127.0.0.1:1", "-n", "0"], 2, "argument -n/--num-requests: expected a whole number >= 1"),
    (["--serving", "http://127.0.0.1:1", "--prompt-words", "400-100"], 2, "expected 1 <= LO <= HI, got '400-100'"),
    (["--serving", "http://127.0.0.1:1", "--output-tokens", "many"], 2, "expected N or LO-HI"),
])
def test_bad_input(argv, status, message):
    r = subprocess.run([sys.executable, bench_serving.__file__, *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == status and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
