"""ember-server as existing clients drive it (issue 43): the OpenAI SDK's two-turn tool loop, the
Anthropic SDK on /v1/messages, /v1/responses, the model and server info routes, OpenAI's
parameter ranges, a burst against --max-queue, a taken port and Ctrl-C during a stream."""
import asyncio
import concurrent.futures
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import anthropic
import httpx
import openai
import pytest
from fastapi.testclient import TestClient

import ember
from ember import LLM, AsyncLLMEngine
from ember.server.app import create_app
from ember.server.args import ServerSettings
from test_server import live_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# One example exchange: SmolLM2-135M then answers with a call of its own (its template teaches JSON calls).
FEW_SHOT = [{"role": "system", "content": "Answer every question with a call to get_weather as JSON."},
            {"role": "user", "content": "What is the weather in Rome?"},
            {"role": "assistant", "content": '{"name": "get_weather", "parameters": {"city": "Rome"}}'},
            {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(smollm2_path, n_ctx=1024, n_threads=2, max_num_seqs=4, deterministic=True) as model:
        yield model


@pytest.fixture(scope="module")
def engine(llm):
    engine = AsyncLLMEngine.from_llm(llm)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine, ServerSettings(alias="smol"))) as c:
        yield c


@pytest.fixture(scope="module")
def base_url(engine):
    with live_server(create_app(engine, ServerSettings(alias="smol"))) as url:
        yield url


# ---- OpenAI ---------------------------------------------------------------------------------
def test_openai_sdk_tool_loop_two_turns(base_url):
    """The loop every agent runs: the SDK's assistant message goes back as it came (content None,
    tool_calls), then the tool's result; the second turn renders and answers."""
    oa = openai.OpenAI(base_url=base_url + "/v1", api_key="k")
    messages = list(FEW_SHOT)
    first = oa.chat.completions.create(model="smol", messages=messages, tools=TOOLS, temperature=0, max_tokens=40)
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and msg.content is None
    [call] = msg.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append(msg)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    second = oa.chat.completions.create(model="smol", messages=messages, tools=TOOLS, temperature=0, max_tokens=8)
    assert second.choices[0].message.role == "assistant" and second.usage.completion_tokens > 0
    streamed = oa.chat.completions.create(model="smol", messages=messages, tools=TOOLS, temperature=0, max_tokens=8,
                                          stream=True)
    assert [c for c in streamed][-1].choices[0].finish_reason is not None


def test_null_content_reaches_the_template_as_the_call(client, engine):
    """A template that never reads tool_calls (SmolLM2's) sees the call written into the turn, in
    the syntax it teaches, instead of an empty turn or a TypeError."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    srv = client.app.state.server
    text = srv.template.render(messages, tools=TOOLS)
    assert '<|im_start|>assistant\n{"name": "get_weather", "parameters": {"city": "Oslo"}}<|im_end|>' in text
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_models_retrieve(base_url):
    oa = openai.OpenAI(base_url=base_url + "/v1", api_key="k")
    model = oa.models.retrieve("smol")
    assert model.id == "smol" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve("gpt-4")


@pytest.mark.parametrize("temperature", [2.5, -0.1])
def test_temperature_range(client, temperature):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "temperature": temperature})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "temperature": 2}).status_code == 200


# ---- OpenAI's Responses API -------------------------------------------------------------------
RESPONSE_TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the weather of a city",
                   "parameters": TOOLS[0]["function"]["parameters"]}]


def test_responses_text_and_stream(base_url):
    oa = openai.OpenAI(base_url=base_url + "/v1", api_key="k")
    resp = oa.responses.create(model="smol", input="Name three colors.", instructions="Be brief.",
                               max_output_tokens=8, temperature=0)
    assert resp.status == "incomplete" and resp.output_text and resp.usage.output_tokens == 8
    events = list(oa.responses.create(model="smol", input="Name three colors.", instructions="Be brief.",
                                      max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == resp.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with pytest.raises(openai.BadRequestError):
        oa.responses.create(model="smol", input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError):
        oa.responses.create(model="smol", input=[{"type": "input_image", "image_url": "x"}])


def test_responses_tool_loop(base_url):
    oa = openai.OpenAI(base_url=base_url + "/v1", api_key="k")
    items = [{"role": m["role"], "content": m["content"]} for m in FEW_SHOT]
    first = oa.responses.create(model="smol", input=items, tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=40)
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    items += [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    second = oa.responses.create(model="smol", input=items, tools=RESPONSE_TOOLS, temperature=0,
                                 max_output_tokens=8)
    assert second.usage.output_tokens > 0
    events = list(oa.responses.create(model="smol", input=items[:4], tools=RESPONSE_TOOLS, temperature=0,
                                      max_output_tokens=40, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["function_call"] and json.loads(done[0].arguments) == {"city": "Paris"}


# ---- Anthropic's Messages API -----------------------------------------------------------------
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Get the weather of a city",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]


# This SDK has no temperature argument any more; the API still takes one (the tests want greedy).
GREEDY = {"temperature": 0}


def _anthropic_few_shot():
    return [{"role": m["role"], "content": m["content"]} for m in FEW_SHOT[1:]]


def test_anthropic_sdk_text_and_stream(base_url):
    client = anthropic.Anthropic(base_url=base_url, api_key="k")
    msg = client.messages.create(model="smol", max_tokens=8, system="Be brief.", extra_body=GREEDY,
                                 messages=[{"role": "user", "content": "Name three colors."}])
    assert msg.role == "assistant" and msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8 and msg.usage.input_tokens > 5
    with client.messages.stream(model="smol", max_tokens=8, system="Be brief.", extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Name three colors."}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text == final.content[0].text
    stopped = client.messages.create(model="smol", max_tokens=30, extra_body=GREEDY, stop_sequences=[" "],
                                     messages=[{"role": "user", "content": "Name three colors."}])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " "
    count = client.messages.count_tokens(model="smol", messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens > 1
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="smol", max_tokens=0, messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])


def test_anthropic_tool_use_round_trip_streamed(base_url):
    """As Claude Code runs it: streamed with tools, the tool_use block back with its tool_result."""
    client = anthropic.Anthropic(base_url=base_url, api_key="k")
    system = FEW_SHOT[0]["content"]
    messages = _anthropic_few_shot()
    with client.messages.stream(model="smol", max_tokens=40, system=system, tools=ANTHROPIC_TOOLS, extra_body=GREEDY,
                                messages=messages) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    [use] = [b for b in final.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    messages += [{"role": "assistant", "content": [b.model_dump() for b in final.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    reply = client.messages.create(model="smol", max_tokens=8, system=system, tools=ANTHROPIC_TOOLS, extra_body=GREEDY,
                                   messages=messages)
    assert reply.usage.output_tokens > 0
    whole = client.messages.create(model="smol", max_tokens=40, system=system, tools=ANTHROPIC_TOOLS, extra_body=GREEDY,
                                   messages=_anthropic_few_shot())
    assert [b.type for b in whole.content] == ["tool_use"] and whole.content[0].input == {"city": "Paris"}


def test_anthropic_sdk_with_an_api_key(engine):
    """The anthropic SDK sends its key as x-api-key, not as a bearer token."""
    with live_server(create_app(engine, ServerSettings(api_key="sekret"))) as url:
        msg = anthropic.Anthropic(base_url=url, api_key="sekret").messages.create(
            model=engine.model_path, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        assert msg.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong").messages.create(
                model=engine.model_path, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])


# ---- info routes ------------------------------------------------------------------------------
def test_props_version_and_vllm_tokenize(client):
    assert client.get("/version").json() == {"version": ember.__version__}
    props = client.get("/props").json()
    assert props["total_slots"] == 4 and props["n_ctx"] == 1024 and "im_start" in props["chat_template"]
    r = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == 2 and r["max_model_len"] == 1024 and "".join(r["token_strs"]) == \
        "Hello world"
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > 5
    assert client.post("/tokenize", json={"content": "Hello world"}).json() == {"tokens": r["tokens"]}


def test_embeddings_dimensions(engine):
    import numpy as np
    with TestClient(create_app(engine, ServerSettings(pooling="mean"))) as c:
        body = {"input": ["red", "a long sentence about the sea"]}
        whole = [d["embedding"] for d in c.post("/v1/embeddings", json=body).json()["data"]]
        short = [d["embedding"] for d in c.post("/v1/embeddings", json=dict(body, dimensions=64)).json()["data"]]
        for w, s in zip(whole, short):
            assert len(s) == 64 and abs(np.linalg.norm(s) - 1) < 1e-5
            np.testing.assert_allclose(s, np.asarray(w[:64]) / np.linalg.norm(w[:64]), rtol=1e-5, atol=1e-6)
        for bad in (0, len(whole[0]) + 1, "64"):
            r = c.post("/v1/embeddings", json=dict(body, dimensions=bad))
            assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions", r.text


# ---- --max-queue ------------------------------------------------------------------------------
def test_max_queue_holds_against_a_burst(smollm2_path):
    """-np 1 --max-queue 1 and four requests at once: one runs, one waits, two get 503 (before the
    fix all four were let in, each seeing the engine before any other was queued)."""
    with LLM(smollm2_path, n_ctx=256, n_threads=2, max_num_seqs=1) as small:
        engine = AsyncLLMEngine.from_llm(small)
        try:
            with live_server(create_app(engine, ServerSettings(max_queue=1))) as url:
                async def burst():
                    async with httpx.AsyncClient(timeout=60) as http:
                        body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True}
                        return await asyncio.gather(*[http.post(url + "/v1/completions", json=body) for _ in range(4)])
                codes = sorted(r.status_code for r in asyncio.run(burst()))
                assert codes == [200, 200, 503, 503]
                # Every admission ended with its request: the next burst is let in the same way.
                codes = sorted(r.status_code for r in asyncio.run(burst()))
                assert codes == [200, 200, 503, 503]
        finally:
            engine.shutdown()


# ---- the command ------------------------------------------------------------------------------
def _server_cmd(model, port, *extra):
    return [sys.executable, "-m", "ember.server", "-m", model, "--port", str(port), "-t", "1", *extra]


def test_taken_port_is_one_line_and_status_1_every_time(smollm2_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        def one(_):
            # Output on pipes, as `out=$(ember-server ...)` has it.
            return subprocess.run(_server_cmd(smollm2_path, port), capture_output=True, text=True, timeout=120)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(one, range(20)))
    for r in runs:
        assert r.returncode == 1, r.stderr
        assert r.stderr.strip().splitlines() == [f"ember-server: error: cannot listen on 127.0.0.1:{port}: "
                                                 f"Address already in use"], r.stderr


def test_ctrl_c_during_a_stream_exits_without_a_traceback(smollm2_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(_server_cmd(smollm2_path, port, "-c", "512", "--shutdown-timeout", "1"),
                            stderr=subprocess.PIPE, text=True)
    got = []
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

        def read():
            body = {"prompt": "Hi", "max_tokens": 400, "ignore_eos": True, "stream": True}
            with contextlib.suppress(httpx.HTTPError):
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
                    got.extend(r.iter_lines())
        reader = threading.Thread(target=read)
        reader.start()
        while not any(line.startswith("data:") for line in got):
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    reader.join(30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "CancelledError" not in err, err
    assert [line for line in got if line][-1] == "data: [DONE]"   # the stream ended, not cut off


def test_version_everywhere():
    assert ember.__version__.count(".") >= 2
    for module in ("ember.cli", "ember.server", "ember.perplexity", "ember.quantize", "ember.bench", "ember.convert"):
        r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and ember.__version__ in r.stdout, (module, r.stdout, r.stderr)
