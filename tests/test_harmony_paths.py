"""gpt-oss's harmony replies on every chat path besides chat completions (tests/test_harmony.py):
Llama.create_chat_completion, LLM.chat, /v1/responses and /v1/messages give the final channel as
the reply and the analysis channel as reasoning, whole, streamed, and cut off inside a channel.
SmolLM2 has no harmony tokens, so harmony replies come from a stub generation; the real model
shows the special tokens' text surviving into the reply."""
import json
import random

import pytest
from fastapi.testclient import TestClient

from ember import LLM, AsyncLLMEngine, Llama, SamplingParams
from ember.chat import ChatTemplate
from ember.outputs import CompletionOutput, RequestOutput
from ember.server.app import create_app
from ember.server.args import ServerSettings

HARMONY = ("{%- for m in messages %}<|start|>{{ m['role'] }}"
           "{%- if m['role'] == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m['content'] }}<|end|>"
           "{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{% endif %}")
REASONING = "The user greets; answer <b>briefly</b>, 2 < 3."
FINAL = "Hello! a <| b"
REPLY = (f"<|channel|>analysis<|message|>{REASONING}<|end|>"
         f"<|start|>assistant<|channel|>final<|message|>{FINAL}")
# max_tokens ran out inside the analysis channel / inside the final channel's header.
CUT_IN_ANALYSIS = f"<|channel|>analysis<|message|>{REASONING[:20]}"
CUT_IN_HEADER = f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|chan"
MESSAGES = [{"role": "user", "content": "Hi"}]
SPECIAL = 5   # SmolLM2's <file_sep>: a special token that does not end generation


def _pieces(text):
    """text in a fresh random split, markers cut in two included."""
    rng = random.Random()
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(3, 15))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


# ---- Llama.create_chat_completion ------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(smollm2_path):
    with Llama(smollm2_path, n_ctx=256, n_threads=2, verbose=False) as model:
        yield model


@pytest.fixture
def harmony_llama(llama):
    llama._chat_template = ChatTemplate(HARMONY)
    yield llama
    llama._chat_template = None


def _stub_run(llama, monkeypatch, text, finish):
    seen = {}

    def run(gen):
        seen["special"] = gen.special
        for piece in _pieces(text):
            yield piece, None
        gen.finish_reason = finish
    monkeypatch.setattr(llama, "_run", run)
    return seen


@pytest.mark.parametrize("text,content,reasoning,finish", [
    (REPLY, FINAL, REASONING, "stop"), (CUT_IN_ANALYSIS, "", REASONING[:20], "length"),
    (CUT_IN_HEADER, "", REASONING, "length")])
def test_llama_chat_completion_splits_the_channels(harmony_llama, monkeypatch, text, content, reasoning, finish):
    seen = _stub_run(harmony_llama, monkeypatch, text, finish)
    choice = harmony_llama.create_chat_completion(MESSAGES, max_tokens=8)["choices"][0]
    assert seen["special"] is True
    expected = {"role": "assistant", "content": content}
    if reasoning:
        expected["reasoning_content"] = reasoning
    assert choice["message"] == expected
    assert choice["finish_reason"] == finish


@pytest.mark.parametrize("text,content,reasoning,finish", [
    (REPLY, FINAL, REASONING, "stop"), (CUT_IN_ANALYSIS, "", REASONING[:20], "length"),
    (CUT_IN_HEADER, "", REASONING, "length")])
def test_llama_chat_completion_streamed(harmony_llama, monkeypatch, text, content, reasoning, finish):
    _stub_run(harmony_llama, monkeypatch, text, finish)
    chunks = list(harmony_llama.create_chat_completion(MESSAGES, max_tokens=8, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"}
    assert "".join(d.get("content", "") for d in deltas) == content
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert not any("<|" in d.get("reasoning_content", "") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == finish


def test_llama_keeps_special_tokens_for_harmony_models_only(llama):
    forced = dict(max_tokens=3, temperature=0.0, logit_bias={SPECIAL: 100.0})
    plain = llama.create_chat_completion(MESSAGES, **forced)["choices"][0]["message"]
    assert plain == {"role": "assistant", "content": ""}   # the GGUF's ChatML template: special text dropped
    llama._chat_template = ChatTemplate(HARMONY)
    try:
        message = llama.create_chat_completion(MESSAGES, **forced)["choices"][0]["message"]
        streamed = "".join(c["choices"][0]["delta"].get("content", "")
                           for c in llama.create_chat_completion(MESSAGES, stream=True, **forced))
    finally:
        llama._chat_template = None
    assert message == {"role": "assistant", "content": "<file_sep>" * 3}   # no harmony markup: all content
    assert streamed == "<file_sep>" * 3
    # create_completion itself is unchanged: special tokens' text stays out.
    assert llama.create_completion("Hi", **forced)["choices"][0]["text"] == ""


# ---- LLM.chat --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(smollm2_path, n_ctx=512, n_threads=2, max_num_seqs=2, deterministic=True) as model:
        yield model


def test_llm_chat_keeps_special_tokens_and_splits(llm):
    params = SamplingParams(max_tokens=3, temperature=0.0, logit_bias={SPECIAL: 100.0})
    out = llm.chat(MESSAGES, params, use_tqdm=False, chat_template=HARMONY)[0].outputs[0]
    assert (out.text, out.reasoning_content) == ("<file_sep>" * 3, "")
    assert params.skip_special_tokens is True   # the caller's params are not changed
    plain = llm.chat(MESSAGES, params, use_tqdm=False)[0].outputs[0]
    assert (plain.text, plain.reasoning_content) == ("", None)


@pytest.mark.parametrize("text,content,reasoning", [
    (REPLY, FINAL, REASONING), (CUT_IN_ANALYSIS, "", REASONING[:20]), (CUT_IN_HEADER, "", REASONING)])
def test_llm_chat_splits_each_output(llm, monkeypatch, text, content, reasoning):
    seen = []

    def generate(prompts, params, use_tqdm):
        seen.extend(params)
        return [RequestOutput(str(i), p["prompt"], p["prompt_token_ids"], None,
                              [CompletionOutput(0, text, [7, 8], None, None, "length")], True)
                for i, p in enumerate(prompts)]
    monkeypatch.setattr(llm, "generate", generate)
    results = llm.chat([MESSAGES, MESSAGES], [SamplingParams(max_tokens=4), SamplingParams(max_tokens=5)],
                       chat_template=HARMONY)
    assert [(r.outputs[0].text, r.outputs[0].reasoning_content) for r in results] == [(content, reasoning)] * 2
    assert [(p.skip_special_tokens, p.max_tokens) for p in seen] == [(False, 4), (False, 5)]


# ---- ember-server: /v1/responses and /v1/messages --------------------------------------------


@pytest.fixture(scope="module")
def engine(llm):
    engine = AsyncLLMEngine.from_llm(llm)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("harmony") / "harmony.jinja"
    path.write_text(HARMONY, encoding="utf-8")
    with TestClient(create_app(engine, ServerSettings(alias="gpt", chat_template=str(path)))) as c:
        yield c


@pytest.fixture
def reply(engine, monkeypatch):
    """Sets the text the stubbed engine answers with, in random pieces; records the params."""
    state = {"text": REPLY, "finish": "stop", "params": []}

    async def generate(prompt, params, request_id):
        state["params"].append(params)
        pieces, text = _pieces(state["text"]), ""
        for k, piece in enumerate(pieces):
            text += piece
            done = k == len(pieces) - 1
            yield RequestOutput(request_id, None, list(prompt), None,
                                [CompletionOutput(0, text, [7] * (k + 1), None, None,
                                                  state["finish"] if done else None)], done)
    monkeypatch.setattr(engine, "generate", generate)
    return state


def _sse(response):
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("text,content,reasoning,finish", [
    (REPLY, FINAL, REASONING, "stop"), (CUT_IN_ANALYSIS, "", REASONING[:20], "length"),
    (CUT_IN_HEADER, "", REASONING, "length")])
def test_responses_reasoning_item_and_message(client, reply, text, content, reasoning, finish):
    reply.update(text=text, finish=finish)
    body = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 8}).json()
    assert reply["params"][-1].skip_special_tokens is False
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning"] + (["message"] if content else [])
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": reasoning}]
    if content:
        assert body["output"][1]["content"][0]["text"] == content
    assert body["status"] == ("completed" if finish == "stop" else "incomplete")


def test_responses_streamed(client, reply):
    events = _sse(client.post("/v1/responses", json={"input": "Hi", "stream": True}))
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert (text, reasoning) == (FINAL, REASONING)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [(0, "reasoning"), (1, "message")]
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"][0]["text"] == REASONING
    assert final["output"][1]["content"][0]["text"] == FINAL


@pytest.mark.parametrize("text,content,reasoning,finish", [
    (REPLY, FINAL, REASONING, "stop"), (CUT_IN_ANALYSIS, "", REASONING[:20], "length"),
    (CUT_IN_HEADER, "", REASONING, "length")])
def test_messages_thinking_block_and_text(client, reply, text, content, reasoning, finish):
    reply.update(text=text, finish=finish)
    body = client.post("/v1/messages", json={"max_tokens": 8, "messages": MESSAGES}).json()
    assert reply["params"][-1].skip_special_tokens is False
    expected = [{"type": "thinking", "thinking": reasoning, "signature": ""}]
    assert body["content"] == expected + ([{"type": "text", "text": content}] if content else [])
    assert body["stop_reason"] == ("end_turn" if finish == "stop" else "max_tokens")
    hidden = client.post("/v1/messages", json={"max_tokens": 8, "messages": MESSAGES,
                                               "thinking": {"type": "disabled"}}).json()
    assert hidden["content"] == ([{"type": "text", "text": content}] if content else [])


def test_messages_streamed(client, reply):
    events = _sse(client.post("/v1/messages", json={"max_tokens": 8, "messages": MESSAGES, "stream": True}))
    starts = [(e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"]
    assert starts == [(0, "thinking"), (1, "text")]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == REASONING
    assert "".join(d.get("text", "") for d in deltas) == FINAL
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    quiet = _sse(client.post("/v1/messages", json={"max_tokens": 8, "messages": MESSAGES, "stream": True,
                                                   "thinking": {"type": "disabled"}}))
    assert [e["content_block"]["type"] for e in quiet if e["type"] == "content_block_start"] == ["text"]


@pytest.mark.parametrize("thinking", ["on", {"type": "sometimes"}, ["enabled"]])
def test_messages_bad_thinking(client, thinking):
    r = client.post("/v1/messages", json={"max_tokens": 8, "messages": MESSAGES, "thinking": thinking})
    assert r.status_code == 400
    assert "thinking" in r.json()["error"]["message"]
