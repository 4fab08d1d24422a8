"""ember-server (ember.server) on the real SmolLM2-135M model: every endpoint through FastAPI's
TestClient, the SSE format, OpenAI's error bodies, the API key, a full queue, client disconnects
cancelling their requests (on a live uvicorn server), the official openai client, and the
`ember-server` command itself."""
import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from ember import LLM, AsyncLLMEngine, SamplingParams
from ember.server import app as server_app
from ember.server.app import create_app
from ember.server.args import ServerSettings, parse_args

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]
LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}   # runs for seconds: to be cut short


@pytest.fixture(scope="module")
def llm(smollm2_path):
    # Deterministic: a request's tokens do not depend on what else is in the batch, so streamed and
    # non-streamed runs of one seed agree even while other tests' requests run beside them.
    with LLM(smollm2_path, n_ctx=512, n_threads=2, max_num_seqs=4, deterministic=True) as model:
        yield model


@pytest.fixture(scope="module")
def engine(llm):
    engine = AsyncLLMEngine.from_llm(llm)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine)) as c:
        yield c


def wait_for(condition, timeout=10.0):
    """Whether condition() comes true within timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def idle(engine):
    """Waits until the engine runs nothing and holds no KV; False if it never does."""
    def check():
        s = engine.stats()
        return s["running"] == 0 and s["waiting"] == 0 and s["kv_blocks_used"] == 0
    return wait_for(check)


@contextlib.contextmanager
def live_server(app):
    """The app on a real uvicorn server on a free port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def events(lines):
    """The JSON payloads of an SSE stream, checking its framing; the last must be [DONE]."""
    out, done = [], False
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: ") and not done, line
        if line == "data: [DONE]":
            done = True
        else:
            out.append(json.loads(line[len("data: "):]))
    assert done, "the stream did not end with data: [DONE]"
    return out


def stream(client, path, body):
    with client.stream("POST", path, json=dict(body, stream=True)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return events(r.iter_lines())


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


# ---- endpoints ---------------------------------------------------------------------------
def test_health_and_models(client, smollm2_path):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    [m] = models["data"]
    assert m["id"] == os.path.basename(smollm2_path) and m["object"] == "model" and m["meta"]["n_ctx"] == 512


def test_completion_matches_the_engine_and_counts_usage(client, llm):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    [want] = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert choice["text"] == want.outputs[0].text and choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(want.prompt_token_ids)
    assert body["usage"]["completion_tokens"] == 12 == len(want.outputs[0].token_ids)
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 12


def test_token_id_prompt_and_echo(client):
    ids = client.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    a = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 5, "temperature": 0}).json()
    b = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "echo": True}).json()
    assert a["usage"]["prompt_tokens"] == len(ids)
    assert b["choices"][0]["text"] == PROMPT + a["choices"][0]["text"]


def test_streamed_completion_joins_to_the_whole(client):
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0.9, "seed": 7,
            "stream_options": {"include_usage": True}}
    whole = client.post("/v1/completions", json=body).json()
    chunks = stream(client, "/v1/completions", body)
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "text_completion" for c in chunks)
    *parts, last = chunks
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in parts)
    assert "".join(c["choices"][0]["text"] for c in parts) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in parts][-1] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in parts[:-1])


def test_chat_completion_and_stream(client):
    body = {"messages": CHAT, "max_tokens": 20, "temperature": 0.8, "seed": 3}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    msg = whole["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"]
    chunks = stream(client, "/v1/chat/completions", body)
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "usage" not in chunks[-1]   # not asked for
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert "".join(d.get("content", "") for d in deltas) == msg["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_chat_matches_llama_create_chat_completion(client, smollm2_path):
    """The server and Llama render one template; the deterministic engine equals Llama token for token."""
    from ember import Llama
    with Llama(smollm2_path, n_ctx=512, n_threads=2, verbose=False) as llama:
        want = llama.create_chat_completion(CHAT, temperature=0, max_tokens=12)
    got = client.post("/v1/chat/completions", json={"messages": CHAT, "temperature": 0, "max_tokens": 12}).json()
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]


def test_chat_max_completion_tokens_and_usage(client, llm, smollm2_path):
    r = client.post("/v1/chat/completions", json={"messages": CHAT, "max_completion_tokens": 3, "max_tokens": 50,
                                                  "temperature": 0, "ignore_eos": True}).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 3
    prompt = client.app.state.server.template.render(CHAT)
    assert r["usage"]["prompt_tokens"] == len(client.post("/tokenize", json={"content": prompt}).json()["tokens"])


def test_n_choices(client):
    body = {"prompt": PROMPT, "max_tokens": 8, "n": 2, "seed": 11, "temperature": 1.0}
    r = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert r["usage"]["completion_tokens"] == 16
    chunks = stream(client, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "n": 2, "seed": 5})
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant" and mine[-1]["finish_reason"] == "length"
    assert all(len(c["choices"]) == 1 for c in chunks)


def test_several_prompts(client):
    """OpenAI's batch prompt: each prompt gets n choices, index = prompt * n + j, usage sums."""
    second = "def fibonacci(n):"
    base = {"max_tokens": 6, "temperature": 0, "n": 2}
    alone = [client.post("/v1/completions", json=dict(base, prompt=p)).json() for p in (PROMPT, second)]
    both = client.post("/v1/completions", json=dict(base, prompt=[PROMPT, second])).json()
    assert [c["index"] for c in both["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in both["choices"]] == [c["text"] for r in alone for c in r["choices"]]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert both["usage"][key] == sum(r["usage"][key] for r in alone)
    ids = [client.post("/tokenize", json={"content": p, "add_special": True}).json()["tokens"]
           for p in (PROMPT, second)]
    as_ids = client.post("/v1/completions", json=dict(base, prompt=ids)).json()
    assert [c["text"] for c in as_ids["choices"]] == [c["text"] for c in both["choices"]]
    mixed = client.post("/v1/completions", json=dict(base, prompt=[PROMPT, ids[1]], echo=True, n=1)).json()
    assert [c["text"] for c in mixed["choices"]] == [PROMPT + alone[0]["choices"][0]["text"],
                                                     second + alone[1]["choices"][0]["text"]]


def test_several_prompts_streamed(client):
    body = {"prompt": [PROMPT, "Once upon a time", "1, 2, 3,"], "max_tokens": 5, "temperature": 0, "n": 2,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    whole = client.post("/v1/completions", json=body).json()
    chunks = stream(client, "/v1/completions", body)
    *parts, last = chunks
    assert last["usage"] == whole["usage"] and whole["usage"]["completion_tokens"] == 30
    assert len({c["id"] for c in chunks}) == 1 and all(len(c["choices"]) == 1 for c in parts)
    for want in whole["choices"]:
        mine = [c["choices"][0] for c in parts if c["choices"][0]["index"] == want["index"]]
        assert "".join(c["text"] for c in mine) == want["text"]
        assert [c["finish_reason"] for c in mine][-1] == "length"


@pytest.mark.parametrize("stop", [".", ["\n", "."], "ris", ["", "."]])   # (empty strings are ignored)
def test_stop_strings(client, stop):
    # Greedy, the prompt goes on " Paris.\n\nThe United States has ..."
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "stop": stop}
    c = client.post("/v1/completions", json=body).json()["choices"][0]
    assert c["finish_reason"] == "stop" and c["text"] == (" Pa" if stop == "ris" else " Paris")
    assert "".join(x["choices"][0]["text"] for x in stream(client, "/v1/completions", body)) == c["text"]
    # vLLM's extra: the stop string stays at the end of the text.
    kept = dict(body, include_stop_str_in_output=True)
    k = client.post("/v1/completions", json=kept).json()["choices"][0]
    assert k["finish_reason"] == "stop" and k["text"] == (" Paris" if stop == "ris" else " Paris.")
    assert "".join(x["choices"][0]["text"] for x in stream(client, "/v1/completions", kept)) == k["text"]


def _greedy_tokens(client, route, req):
    """The greedy reply's tokens, as text pieces (completions' or chat's logprobs)."""
    c = client.post(route, json=dict(req, logprobs=0 if "messages" not in req else True)).json()["choices"][0]
    assert c["finish_reason"] == "length" and c["stop_reason"] is None
    lp = c["logprobs"]
    return lp["tokens"] if "tokens" in lp else [t["token"] for t in lp["content"]]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_stop_token_ids_and_stop_reason(client, route):
    """vLLM's stop_token_ids end the text before the token; each choice's stop_reason names what
    ended it (the token id, the stop string; null for length), whole and in the last chunk."""
    req = {"max_tokens": 12, "temperature": 0}
    req.update({"prompt": PROMPT} if "chat" not in route else {"messages": [{"role": "user", "content": PROMPT}]})
    tokens = _greedy_tokens(client, route, req)
    ids = {}
    for k in range(2, len(tokens)):   # a token not seen before, one id on its own, its text first there
        ids = client.post("/tokenize", json={"content": tokens[k], "add_special": False}).json()["tokens"]
        if (tokens[k] not in tokens[:k] and len(ids) == 1 and
                "".join(tokens[:k + 1]).find(tokens[k]) == len("".join(tokens[:k]))):
            break
    assert len(ids) == 1, tokens
    for stop, want in (({"stop_token_ids": [ids[0]]}, ids[0]), ({"stop": tokens[k]}, tokens[k])):
        whole = client.post(route, json=dict(req, **stop)).json()["choices"][0]
        last = stream(client, route, dict(req, **stop))[-1]["choices"][0]
        assert whole["finish_reason"] == last["finish_reason"] == "stop", stop
        assert whole["stop_reason"] == last["stop_reason"] == want, stop
        text = whole["text"] if "chat" not in route else whole["message"]["content"]
        assert text == "".join(tokens[:k]), stop


def test_completion_logprobs(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == r["usage"]["completion_tokens"] == 6
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert logprob <= 0 and top[tok] == logprob and len(top) <= 4
        assert max(top.values()) == logprob   # greedy: the sampled token is the likeliest
    echo = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0,
                                                "logprobs": 0, "echo": True}).json()["choices"][0]["logprobs"]
    assert echo["token_logprobs"][0] is None and all(x <= 0 for x in echo["token_logprobs"][1:])
    assert "".join(echo["tokens"]).startswith(PROMPT)
    streamed = stream(client, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3})
    assert [t for c in streamed for t in (c["choices"][0]["logprobs"] or {"tokens": []})["tokens"]] == lp["tokens"]


def test_chat_logprobs(client):
    r = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5, "temperature": 0,
                                                  "logprobs": True, "top_logprobs": 2}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for e in content:
        assert bytes(e["bytes"]).decode("utf-8", errors="ignore") == e["token"]
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == e["logprob"]


def test_sampling_parameters_are_taken(client):
    base = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    ids = client.post("/tokenize", json={"content": " Paris"}).json()["tokens"]
    banned = client.post("/v1/completions", json=dict(base, logit_bias={str(ids[0]): -100})).json()
    assert "Paris" not in banned["choices"][0]["text"]
    for extra in ({"top_k": 5, "min_p": 0.1, "repeat_penalty": 1.3, "temperature": 0.7, "seed": 1},
                  {"presence_penalty": 1.5, "frequency_penalty": 1.0, "top_p": 0.5}):
        assert client.post("/v1/completions", json=dict(base, **extra)).status_code == 200


def test_tokenize_and_detokenize(client):
    r = client.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    assert "".join(t["piece"] for t in r["tokens"]) == "Hello world"
    ids = [t["id"] for t in r["tokens"]]
    assert client.post("/tokenize", json={"content": "Hello world"}).json() == {"tokens": ids}
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello world"}
    special = client.post("/tokenize", json={"content": "<|im_start|>"}).json()["tokens"]
    assert len(special) == 1
    assert_error(client.post("/detokenize", json={"tokens": [-1]}), 400, "tokens")


def test_metrics(client, engine):
    client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    text = client.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    for name in ("num_requests_running", "num_requests_waiting", "prompt_tokens_total", "generation_tokens_total",
                 "kv_blocks_used", "kv_blocks_cached", "prefix_cache_hits_total", "kv_swaps_out_total",
                 "kv_swaps_in_total", "kv_host_blocks_total", "kv_host_cache_hits_total",
                 "engine_forward_seconds_total", "engine_sample_seconds_total",
                 "time_to_first_token_seconds_count", "inter_token_latency_seconds_count"):
        assert f"ember:{name}" in values, name
    assert values["ember:time_to_first_token_seconds_count"] >= 1
    assert values["ember:inter_token_latency_seconds_count"] >= 3
    ttft = "ember:time_to_first_token_seconds"
    assert values[ttft + '_bucket{le="+Inf"}'] == values[ttft + "_count"]
    assert values["ember:generation_tokens_total"] == engine.stats()["generation_tokens"]
    assert "# TYPE ember:time_to_first_token_seconds histogram" in text


def test_chat_page(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in r.text
    assert 'src="http' not in r.text and 'href="http' not in r.text   # nothing from a CDN


# ---- errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"prompt": PROMPT, "temperature": -1}, "temperature"),
    ({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
    ({"prompt": PROMPT, "n": 0}, "n"),
    ({"prompt": PROMPT, "top_p": 1.5}, "top_p"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ({"prompt": PROMPT, "stop": 5}, "stop"),
    ({"prompt": PROMPT, "stop_token_ids": 5}, "stop_token_ids"),
    ({"prompt": PROMPT, "stop_token_ids": ["x"]}, "stop_token_ids"),
    ({"prompt": PROMPT, "stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"prompt": PROMPT, "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": PROMPT, "logit_bias": {"10": 500}}, "logit_bias"),
    ({"prompt": PROMPT, "logprobs": 50}, "logprobs"),
    ({"prompt": PROMPT, "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": PROMPT, "stream": "yes"}, "stream"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", 5]}, "prompt"),
    ({"prompt": ["a", []]}, "prompt"),
    ({"prompt": [[1, 2], [10**9]]}, "prompt"),
    ({"prompt": ["a"] * 257}, "prompt"),
    ({"prompt": {"text": "a"}}, "prompt"),
    ({"prompt": ["a", "b", "c"], "n": 128}, "n"),   # 384 sequences: more than 4 running + 256 waiting
    ({}, "prompt"),
])
def test_bad_parameters(client, body, param):
    assert_error(client.post("/v1/completions", json=body), 400, param)


def test_bad_chat_requests(client):
    assert_error(client.post("/v1/chat/completions", json={"messages": []}), 400, "messages")
    assert_error(client.post("/v1/chat/completions", json={"messages": [{"content": "x"}]}), 400, "messages[0]")
    assert_error(client.post("/v1/chat/completions", json={"messages": CHAT, "top_logprobs": 2}), 400, "top_logprobs")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert_error(client.post("/v1/chat/completions", json={"messages": image}), 400, "messages[0].content")
    for missing in ({"role": "user"}, {"role": "system", "content": None}):   # not a template's TypeError
        assert_error(client.post("/v1/chat/completions", json={"messages": [missing]}), 400, "messages[0].content")
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three "},
                                          {"type": "text", "text": "colors."}]}]
    a = client.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 4, "temperature": 0}).json()
    b = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "temperature": 0}).json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                          "parameters": CITY}}]


def test_chat_with_tools(client):
    """A conversation that called a tool and got its result: the template takes the assistant's call
    (its arguments string read into an object) and the tool message; the reply, whole or streamed,
    is content or well-formed tool calls (tests/test_tool_calls.py covers the parsing)."""
    messages = CHAT + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 12, "temperature": 0}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    msg = choice["message"]
    assert msg["role"] == "assistant"
    if choice["finish_reason"] == "tool_calls":
        assert all(c["type"] == "function" and json.loads(c["function"]["arguments"]) is not None
                   for c in msg["tool_calls"])
    else:
        assert msg["content"] and "tool_calls" not in msg
    chunks = stream(client, "/v1/chat/completions", body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == (msg["content"] or "")
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    none = client.post("/v1/chat/completions", json=dict(body, tool_choice="none")).json()["choices"][0]
    assert "tool_calls" not in none["message"]


def test_bad_tool_requests(client):
    def post(**fields):
        return client.post("/v1/chat/completions", json=dict({"messages": CHAT, "max_tokens": 2}, **fields))
    err = assert_error(post(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), 400,
                       "tool_choice")
    assert "not among 'tools'" in err["message"]
    assert_error(post(tools=[{"type": "function", "function": {}}]), 400, "tools[0].function.name")
    assert_error(post(tool_choice="auto"), 400, "tool_choice")
    assert_error(post(tools=TOOLS, parallel_tool_calls=1), 400, "parallel_tool_calls")


def test_malformed_json_unknown_model_and_route(client):
    as_json = {"Content-Type": "application/json"}
    assert_error(client.post("/v1/completions", content=b"{not json", headers=as_json), 400, code="invalid_json")
    assert_error(client.post("/v1/completions", content=b"[1, 2]", headers=as_json), 400, code="invalid_json")
    assert_error(client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": CHAT}), 404, "model",
                 "model_not_found")
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/completions"), 405)


def test_prompt_longer_than_the_context(client):
    long_prompt = "hello " * 600
    assert_error(client.post("/v1/completions", json={"prompt": long_prompt}), 400, "prompt", "context_length_exceeded")
    assert_error(client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 600}), 400, "max_tokens",
                 "context_length_exceeded")
    big = [{"role": "user", "content": long_prompt}]
    assert_error(client.post("/v1/chat/completions", json={"messages": big}), 400, "messages")
    assert client.get("/health").status_code == 200   # never dies of a request


def test_body_size_limit(engine):
    app = create_app(engine, ServerSettings(max_body_bytes=1000))
    with TestClient(app) as c:
        assert_error(c.post("/v1/completions", json={"prompt": "x" * 2000}), 413)
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
    # A Content-Length past the limit is refused before the body comes (it may never come whole).
    with live_server(app) as url:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(10**9))
        conn.endheaders(b'{"prompt": "x"}')
        r = conn.getresponse()
        assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large"
        conn.close()


def test_one_log_line_per_request(client, caplog):
    with caplog.at_level(logging.INFO, logger="ember.server"):
        client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True})
        client.post("/v1/completions", json={"prompt": PROMPT, "temperature": -1})
        client.post("/v1/completions", json={"prompt": [PROMPT, PROMPT], "max_tokens": 2, "ignore_eos": True})
        client.get("/v1/nothing")
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.server"]
    assert len(lines) == 4, lines
    assert '"POST /v1/completions" 200' in lines[0] and " length prompt=" in lines[0] and "completion=3" in lines[0]
    assert '"POST /v1/completions" 400' in lines[1] and "'temperature' must be" in lines[1]
    assert "completion=4" in lines[2] and "ttft=" in lines[2]
    assert '"GET /v1/nothing" 404' in lines[3]


def test_template_exception_is_a_400(engine, tmp_path):
    f = tmp_path / "strict.jinja"
    f.write_text("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}"
                 "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
    with TestClient(create_app(engine, ServerSettings(chat_template=str(f)))) as c:
        err = assert_error(c.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "x"}]}),
                           400, "messages")
        assert "first message must be from the user" in err["message"]
        assert c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}).status_code == 200


def test_api_key(engine):
    with TestClient(create_app(engine, ServerSettings(api_key="sekret"))) as c:
        body = {"prompt": PROMPT, "max_tokens": 2}
        assert_error(c.post("/v1/completions", json=body), 401, code="invalid_api_key")
        assert_error(c.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(c.get("/v1/models", headers={"Authorization": "Basic sekret"}), 401)
        assert c.get("/metrics").headers["www-authenticate"] == "Bearer"
        assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert c.get("/health").status_code == 200   # open, for load balancers


def test_loading_from_arguments(smollm2_path, monkeypatch, caplog):
    monkeypatch.setattr(server_app, "LOAD_LOG_EVERY_S", 0.001)   # SmolLM2 loads in a blink
    args = parse_args(["-m", smollm2_path, "-c", "256", "-t", "2", "-np", "2", "--alias", "smol",
                       "--tool-call-parser", "mistral"])
    app = create_app(args)
    with caplog.at_level(logging.INFO, logger="ember.server"), TestClient(app) as c:
        deadline = time.monotonic() + 60
        while (r := c.get("/health")).status_code == 503:
            assert_error(r, 503, code="model_loading")
            assert r.headers["retry-after"]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 200
        r = c.post("/v1/chat/completions", json={"model": "smol", "messages": CHAT, "max_tokens": 3}).json()
        assert r["model"] == "smol" and r["usage"]["completion_tokens"] <= 3
        engine = app.state.server.engine
    log = [r.getMessage() for r in caplog.records if r.name == "ember.server"]
    assert log[0].startswith("loading ") and any(line.startswith("still loading ") for line in log)
    assert any(line.startswith("model smol ready in ") and line.endswith("tool calls: mistral)") for line in log)
    with pytest.raises(RuntimeError, match="not running"):   # the app made this engine, so it shut it down
        asyncio.run(first_output(engine))


async def first_output(engine):
    async for out in engine.generate("x", SamplingParams(max_tokens=1)):
        return out


def test_a_model_that_fails_to_load(tmp_path):
    failures = []
    app = create_app(parse_args(["-m", str(tmp_path / "missing.gguf")]), on_load_failed=failures.append)
    with TestClient(app) as c:
        deadline = time.monotonic() + 10
        while not failures:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        err = assert_error(c.get("/health"), 503)
        assert "missing.gguf" in err["message"]


# ---- under load and abuse (live server) --------------------------------------------------
def test_disconnect_cancels_the_request(engine):
    with live_server(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as http:
        for path, body, running in (("/v1/completions", {"prompt": PROMPT}, 2),
                                    ("/v1/chat/completions", {"messages": CHAT}, 2),
                                    ("/v1/completions", {"prompt": [PROMPT, "Hello"]}, 4)):
            with http.stream("POST", path, json=dict(body, stream=True, n=2, **LONG)) as r:
                lines = r.iter_lines()
                for _ in range(6):
                    next(lines)
                assert wait_for(lambda: engine.stats()["running"] == running)
            assert idle(engine), engine.stats()
        # Not streaming: the client gives up waiting.
        for prompt in (PROMPT, [PROMPT, "Hello", "Bye"]):
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/completions", json=dict(LONG, prompt=prompt), timeout=1.0)
            assert idle(engine), engine.stats()
        metrics = http.get("/metrics").text
        assert 'ember:requests_total{outcome="disconnected"} 5' in metrics


def test_full_queue_answers_503(engine):
    with live_server(create_app(engine, ServerSettings(max_queue=1))) as url, \
            httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=dict(LONG, prompt=PROMPT, n=4, stream=True)) as r:
            lines = r.iter_lines()
            next(lines)
            assert wait_for(lambda: engine.stats()["running"] == 4)   # every slot taken
            with http.stream("POST", "/v1/completions", json=dict(LONG, prompt=PROMPT, stream=True)):
                assert wait_for(lambda: engine.stats()["waiting"] == 1)
                err = assert_error(http.post("/v1/completions", json={"prompt": PROMPT}), 503, code="queue_full")
                assert "retry" in err["message"]
                assert int(http.post("/v1/completions", json={"prompt": PROMPT}).headers["retry-after"]) >= 1
    assert idle(engine), engine.stats()


def test_concurrent_streams_share_the_batch(engine):
    """Eight streaming clients at once all finish with the right token counts."""
    results = {}

    def one(http, i):
        with http.stream("POST", "/v1/completions", json={
                "prompt": f"Story {i}:", "max_tokens": 24, "ignore_eos": True, "stream": True, "seed": i,
                "stream_options": {"include_usage": True}}) as r:
            results[i] = events(r.iter_lines())[-1]["usage"]["completion_tokens"]

    with live_server(create_app(engine)) as url, httpx.Client(base_url=url, timeout=60) as http:
        threads = [threading.Thread(target=one, args=(http, i)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {i: 24 for i in range(8)}
    assert idle(engine)


def test_openai_client(engine):
    with live_server(create_app(engine, ServerSettings(api_key="k", alias="smol"))) as url:
        oa = openai.OpenAI(base_url=url + "/v1", api_key="k")
        whole = oa.chat.completions.create(model="smol", messages=CHAT, max_tokens=12, seed=4, temperature=0.9)
        parts = list(oa.chat.completions.create(model="smol", messages=CHAT, max_tokens=12, seed=4, temperature=0.9,
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == whole.choices[0].message.content
        assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens
        c = oa.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0, n=2, stop=["\n"],
                                  logprobs=1)
        assert len(c.choices) == 2 and c.choices[0].text == c.choices[1].text
        assert c.choices[0].logprobs.token_logprobs
        s = list(oa.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0, stop=["\n"],
                                       stream=True))
        assert "".join(x.choices[0].text for x in s) == c.choices[0].text
        with pytest.raises(openai.NotFoundError):
            oa.completions.create(model="nope", prompt="x")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="bad").models.list()
        with pytest.raises(openai.BadRequestError):
            oa.completions.create(model="smol", prompt="x", temperature=-2)


# ---- the command -------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_command_serves_and_stops(smollm2_path):
    port = free_port()
    env = dict(os.environ, EMBER_API_KEY="k")
    proc = subprocess.Popen([sys.executable, "-m", "ember.server", "-m", smollm2_path, "-c", "256", "-t", "2",
                             "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2},
                       headers={"Authorization": "Bearer k"})
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err   # Ctrl-C, as every ember command
    assert "loading" in err and "ready" in err
    request_lines = [line for line in err.splitlines() if '"POST /v1/completions' in line]
    assert len(request_lines) == 1 and "prompt=" in request_lines[0] and "completion=2" in request_lines[0]


def test_command_fails_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ember.server", "-m", str(tmp_path / "missing.gguf"),
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("ember-server: error:") and "Traceback" not in r.stderr


def test_bad_tool_call_parser_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["-m", "x.gguf", "--tool-call-parser", "xml"])
    assert "--tool-call-parser: invalid choice: 'xml'" in capsys.readouterr().err


def test_metrics_count_host_tier_swaps(smollm2_path):
    """A pool of 8 blocks for 4 sequences that each need 5: preempted sequences swap out to the
    host tier and back, and /metrics counts it."""
    with LLM(smollm2_path, n_ctx=128, n_threads=2, max_num_seqs=4, kv_mb=3, kv_host_mb=16) as small:
        engine = AsyncLLMEngine.from_llm(small)
        try:
            with TestClient(create_app(engine)) as c:
                body = {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    replies = list(pool.map(lambda _: c.post("/v1/completions", json=body), range(4)))
                assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
                values = dict(line.rsplit(" ", 1) for line in c.get("/metrics").text.splitlines()
                              if line.startswith("ember:kv_"))
        finally:
            engine.shutdown()
    assert float(values["ember:kv_swaps_out_total"]) > 0
    assert values["ember:kv_swaps_in_total"] == values["ember:kv_swaps_out_total"]
    assert float(values["ember:kv_host_blocks_used"]) == 0
