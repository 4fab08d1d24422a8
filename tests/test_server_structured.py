"""ember-server's structured output and reasoning on the real SmolLM2-135M: response_format
(json_object, json_schema), vLLM's structured_outputs and guided_* fields, llama-server's grammar and
json_schema, forced tool calls (tool_choice required or named) and lazy ones, every reply checked
with jsonschema; a Qwen3-style template whose prompt opens a thought, split into reasoning_content
and content, whole and streamed, the thinking budget closing the thought at its count and the
answer constrained after it; the official openai client's parse() with a pydantic model; and the
400s of bad requests, before anything runs."""
import json
import random
from typing import Annotated

import jsonschema
import openai
import pydantic
import pytest
from fastapi.testclient import TestClient

from ember import LLM, AsyncLLMEngine, SamplingParams
from ember.server.app import create_app
from ember.server.args import ServerSettings

from test_server import assert_error, events, live_server

CHAT = [{"role": "user", "content": "Describe a city as JSON."}]
# Qwen3's shape: tools in the system turn with the <tool_call> syntax, the thought opened in the
# prompt unless enable_thinking is false (then it is closed there, empty).
QWEN3_STYLE = (
    "{%- if tools %}<|im_start|>system\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>."
    "\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"], "additionalProperties": False}}}


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
    with TestClient(create_app(engine)) as c:
        yield c


@pytest.fixture(scope="module")
def thinking(engine, tmp_path_factory):
    """The server with the Qwen3-style template (hermes tool calls, <think> opened in the prompt)."""
    path = tmp_path_factory.mktemp("qwen3") / "qwen3.jinja"
    path.write_text(QWEN3_STYLE, encoding="utf-8")
    with TestClient(create_app(engine, ServerSettings(chat_template=str(path)))) as c:
        yield c


def chat(client, **fields):
    body = dict({"messages": CHAT, "max_tokens": 120, "temperature": 0}, **fields)
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def streamed(client, **fields):
    body = dict({"messages": CHAT, "max_tokens": 120, "temperature": 0, "stream": True}, **fields)
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        chunks = events(r.iter_lines())
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return ("".join(d.get("content") or "" for d in deltas), "".join(d.get("reasoning_content", "") for d in deltas),
            [c for d in deltas for c in d.get("tool_calls", [])], chunks[-1]["choices"][0]["finish_reason"])


def random_schema(rng, depth=0):
    """A JSON schema of the kinds clients send: nested objects, bounded arrays, enums, anyOf,
    string formats and lengths, required fields."""
    kinds = ["string", "integer", "number", "boolean", "enum", "format"] + (["object", "array", "anyOf"] * (depth < 2))
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 3), "maxLength": rng.randint(4, 12)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": 1000}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 3, None, "x y"], rng.randint(1, 4))}
    if kind == "format":   # (bounded: a small model may run on in a string it may end anywhere)
        return {"type": "string", "format": rng.choice(["email", "uuid", "ipv4"]), "maxLength": 40}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": lo,
                "maxItems": lo + rng.randint(0, 3)}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(2)]}
    names = rng.sample(["name", "age", "tags", "city", "ok", "kind", "size"], rng.randint(1, 4))
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": rng.sample(names, rng.randint(0, len(names))), "additionalProperties": False}


def object_schema(rng):
    schema = random_schema(rng, 1)
    return schema if schema.get("type") == "object" else {"type": "object", "properties": {"value": schema},
                                                          "required": ["value"], "additionalProperties": False}


FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def check(schema, text):
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


# ---- constraints on the whole reply ---------------------------------------------------------

def test_response_format_json_schema_validates(client):
    rng, stopped = random.Random(), 0
    for _ in range(12):
        schema = object_schema(rng)
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
        choice = chat(client, response_format=fmt, max_tokens=300, temperature=rng.choice([0, 0.8]),
                      seed=rng.randrange(1 << 30))
        if choice["finish_reason"] == "length":   # a number's digits or a string may go on past max_tokens
            continue
        assert choice["finish_reason"] == "stop", choice
        check(schema, choice["message"]["content"])
        stopped += 1
    assert stopped >= 6, f"only {stopped} of 12 replies ended within max_tokens"


def test_every_spelling_of_a_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 15},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    for fields in ({"structured_outputs": {"json": schema}}, {"guided_json": schema},
                   {"guided_json": json.dumps(schema)}, {"json_schema": schema},
                   {"response_format": {"type": "json_object", "schema": schema}}):
        check(schema, chat(client, **fields)["message"]["content"])
    assert isinstance(json.loads(chat(client, response_format={"type": "json_object"})["message"]["content"]), dict)
    assert isinstance(json.loads(chat(client, structured_outputs={"json_object": True})["message"]["content"]), dict)


def test_choice_regex_and_grammar(client):
    assert chat(client, guided_choice=["sunny", "rainy"])["message"]["content"] in ("sunny", "rainy")
    assert chat(client, structured_outputs={"choice": ["a b", "c"]})["message"]["content"] in ("a b", "c")
    text = chat(client, guided_regex=r"[A-Z][a-z]{2,8} is [0-9]{1,3}")["message"]["content"]
    assert text.split(" is ")[1].isdigit()
    gbnf = 'root ::= "Answer: " ("yes" | "no") "."'
    for fields in ({"grammar": gbnf}, {"guided_grammar": gbnf}, {"structured_outputs": {"grammar": gbnf}}):
        assert chat(client, **fields)["message"]["content"] in ("Answer: yes.", "Answer: no.")
    r = client.post("/v1/completions", json={"prompt": "The answer is", "max_tokens": 20, "temperature": 0,
                                             "guided_regex": "( [0-9]+)+"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].split()[0].isdigit()


def test_constrained_stream_joins_to_the_whole(client):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                        "minItems": 2, "maxItems": 3}},
              "required": ["tags"], "additionalProperties": False}
    fields = dict(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    whole = chat(client, **fields)["message"]["content"]
    content, _, _, finish = streamed(client, **fields)
    assert content == whole and finish == "stop"
    check(schema, whole)


# ---- tool calls ------------------------------------------------------------------------------

def test_required_tool_calls_are_valid_calls(thinking):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    rng = random.Random()
    for parallel in (False, True):
        for _ in range(3):
            drawn = dict(thinking_token_budget=rng.randint(0, 6), seed=rng.randrange(1 << 30))
            choice = chat(thinking, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel,
                          max_tokens=300, temperature=0.8, **drawn)
            if parallel and choice["finish_reason"] == "length":   # a small model may call on and on
                continue
            calls = choice["message"].get("tool_calls")
            assert choice["finish_reason"] == "tool_calls" and calls and (parallel or len(calls) == 1), (drawn, choice)
            for call in calls:
                check(schemas[call["function"]["name"]], call["function"]["arguments"])


def test_a_named_tool_is_called(thinking):
    named = {"type": "function", "function": {"name": "get_time"}}
    calls = chat(thinking, tools=[WEATHER, TIME], tool_choice=named, thinking_token_budget=2)["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    check(TIME["function"]["parameters"], calls[0]["function"]["arguments"])
    content, _, calls, finish = streamed(thinking, tools=[WEATHER, TIME], tool_choice=named, thinking_token_budget=2)
    assert [c["function"]["name"] for c in calls] == ["get_time"] and finish == "tool_calls"


def test_lazy_tool_calls_leave_free_text_free(thinking):
    """tool_choice auto: until the model opens a call, the reply is what it is without tools
    constrained (greedy, token for token)."""
    fields = dict(tools=[WEATHER], chat_template_kwargs={"enable_thinking": False}, max_tokens=40)
    auto = chat(thinking, **fields)
    free = chat(thinking, tool_choice="none", **fields)
    if "tool_calls" not in auto["message"]:
        assert auto["message"]["content"] == free["message"]["content"]


# ---- reasoning -------------------------------------------------------------------------------

def test_reasoning_is_split_whole_and_streamed(thinking):
    choice = chat(thinking, thinking_token_budget=12, max_tokens=40)
    message = choice["message"]
    assert message["reasoning_content"] and "<think>" not in message["content"] + message["reasoning_content"]
    content, reasoning, _, finish = streamed(thinking, thinking_token_budget=12, max_tokens=40)
    assert (content, reasoning, finish) == (message["content"], message["reasoning_content"], choice["finish_reason"])
    off = chat(thinking, chat_template_kwargs={"enable_thinking": False}, max_tokens=20)["message"]
    assert "reasoning_content" not in off   # the template closed the thought: all content


@pytest.mark.parametrize("budget", [0, 1, 5, 16])
def test_the_budget_ends_thinking_at_its_count(llm, budget):
    """LLM.chat with the budget: the thought holds exactly budget tokens (SmolLM2 never closes a
    thought of its own), then the closing tag is forced and the answer follows."""
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=budget + 30)
    out = llm.chat(CHAT, params, use_tqdm=False, chat_template=QWEN3_STYLE, thinking_token_budget=budget)[0]
    ids = out.outputs[0].token_ids
    text = "".join(tok.decode([t]) for t in ids[:budget + 1])
    free = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=budget + 1), use_tqdm=False,
                    chat_template=QWEN3_STYLE)[0].outputs[0]
    assert list(ids[:budget]) == list(free.token_ids[:budget])   # thinking as it would have been
    closing = tok.decode(list(ids[budget:]))
    assert closing.startswith("</think>"), (text, closing)
    assert out.outputs[0].reasoning_content == tok.decode(list(ids[:budget])).strip()


def test_llm_chat_constrains_the_answer_after_the_thought(llm):
    from ember.structured import StructuredOutputsParams
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"],
              "additionalProperties": False}
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=schema))
    out = llm.chat(CHAT, params, use_tqdm=False, chat_template=QWEN3_STYLE, thinking_token_budget=6)[0].outputs[0]
    check(schema, out.text)
    assert out.reasoning_content and "</think>" not in out.text
    assert params.structured_outputs.json == schema   # the caller's params are not changed
    with pytest.raises(ValueError, match="thinking_token_budget"):
        llm.chat(CHAT, params, use_tqdm=False, chat_template=QWEN3_STYLE, thinking_token_budget=-1)


def test_structured_answer_follows_the_thought(thinking):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    for budget in (0, 4, 10):
        message = chat(thinking, response_format=fmt, thinking_token_budget=budget)["message"]
        check(schema, message["content"])
        assert bool(message.get("reasoning_content")) == (budget > 0)


def test_reasoning_effort_reaches_the_template(engine, tmp_path):
    path = tmp_path / "effort.jinja"
    path.write_text("{{ 'Reasoning: ' + (reasoning_effort or '') + '.' }}{% for m in messages %}"
                    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
                    encoding="utf-8")
    with TestClient(create_app(engine, ServerSettings(chat_template=str(path)))) as c:
        usage = [c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, **extra}).json()["usage"]
                 for extra in ({}, {"reasoning_effort": "high"})]
    assert usage[1]["prompt_tokens"] > usage[0]["prompt_tokens"]   # "Reasoning: high." against "Reasoning: ."


def test_a_grammar_follows_the_thought(thinking):
    gbnf = 'root ::= "Answer: " ("yes" | "no") "."'
    for fields in ({"grammar": gbnf}, {"guided_choice": ["yes", "no"]}, {"guided_regex": "[0-9]{2}"}):
        message = chat(thinking, thinking_token_budget=3, **fields)["message"]
        assert message["reasoning_content"]
        assert message["content"] in ("Answer: yes.", "Answer: no.", "yes", "no") or \
            (len(message["content"]) == 2 and message["content"].isdigit())


def test_usage_counts_the_reasoning_tokens(thinking, llm):
    """usage.completion_tokens_details.reasoning_tokens: the reply's tokens up to the one that
    completes </think>, whole and streamed (include_usage); all of a reply cut off while it thinks;
    none where the template closed the thought."""
    tok = llm.get_tokenizer()
    ids = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=30), use_tqdm=False, chat_template=QWEN3_STYLE,
                   thinking_token_budget=5)[0].outputs[0].token_ids
    closing = next(k for k in range(1, len(ids) + 1) if "</think>" in tok.decode(list(ids[:k])))
    body = dict({"messages": CHAT, "max_tokens": 30, "temperature": 0, "thinking_token_budget": 5})
    usage = thinking.post("/v1/chat/completions", json=body).json()["usage"]
    assert usage["completion_tokens"] == len(ids) and usage["completion_tokens_details"]["reasoning_tokens"] == closing
    with thinking.stream("POST", "/v1/chat/completions",
                         json=dict(body, stream=True, stream_options={"include_usage": True})) as r:
        assert events(r.iter_lines())[-1]["usage"] == usage
    cut = thinking.post("/v1/chat/completions", json=dict(body, max_tokens=3, thinking_token_budget=-1)).json()
    assert cut["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    off = thinking.post("/v1/chat/completions",
                        json=dict(body, chat_template_kwargs={"enable_thinking": False}, max_tokens=8)).json()
    assert off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    responses = thinking.post("/v1/responses", json={"input": CHAT[0]["content"], "max_output_tokens": 30,
                                                     "temperature": 0, "reasoning": {"effort": "low"}}).json()
    assert 0 < responses["usage"]["output_tokens_details"]["reasoning_tokens"] <= responses["usage"]["output_tokens"]


def test_server_reasoning_budget_flag(engine, tmp_path):
    path = tmp_path / "qwen3.jinja"
    path.write_text(QWEN3_STYLE, encoding="utf-8")
    settings = ServerSettings(chat_template=str(path), reasoning_budget=3)
    with TestClient(create_app(engine, settings)) as c:
        capped = chat(c, max_tokens=30)["message"]
        assert capped["reasoning_content"] == chat(c, max_tokens=30, thinking_token_budget=3)["message"][
            "reasoning_content"]
        assert chat(c, max_tokens=3, thinking_token_budget=-1)["finish_reason"] == "length"   # no limit: thinks on
    with TestClient(create_app(engine, ServerSettings(chat_template=str(path), reasoning_parser="none"))) as c:
        message = chat(c, max_tokens=10)["message"]
        assert "reasoning_content" not in message


# ---- the openai client -----------------------------------------------------------------------

class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    population: int = pydantic.Field(ge=0)
    landmarks: list[Annotated[str, pydantic.Field(max_length=30)]] = pydantic.Field(max_length=3)


def test_openai_client_parse(engine):
    with live_server(create_app(engine, ServerSettings(alias="smol"))) as url:
        oa = openai.OpenAI(base_url=url + "/v1", api_key="none")
        parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
        done = parse(model="smol", messages=CHAT, response_format=City, max_tokens=200, temperature=0)
        city = done.choices[0].message.parsed
        assert isinstance(city, City) and len(city.landmarks) <= 3
        with pytest.raises(openai.BadRequestError):
            oa.chat.completions.create(model="smol", messages=CHAT, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}})


# ---- bad requests ------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,param,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format.json_schema.schema", "objectx"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema",
     "schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "not one of"),
    ({"response_format": "json"}, "response_format", "object"),
    ({"guided_regex": "(unclosed"}, "guided_regex", ""),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"grammar": "root ::= ("}, "grammar", ""),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs", "unknown fields jsn"),
    ({"guided_choice": ["a"], "grammar": 'root ::= "a"'}, "grammar", "constrained twice"),
    ({"thinking_token_budget": -2}, "thinking_token_budget", ">= 0"),
    ({"reasoning_format": "thoughts"}, "reasoning_format", "not one of"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "must be one of"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among"),
])
def test_bad_constraints_are_400s_naming_the_field(client, engine, fields, param, words):
    before = engine.stats()
    r = client.post("/v1/chat/completions", json=dict({"messages": CHAT, "max_tokens": 4}, **fields))
    err = assert_error(r, 400, param)
    assert words in err["message"]
    assert engine.stats()["running"] == before["running"] == 0   # refused before anything ran


def test_forced_calls_in_the_messages_and_responses_apis(thinking, engine, tmp_path):
    """Anthropic's tool_choice any / tool (and thinking.budget_tokens), the Responses API's required
    (under the server's --reasoning-budget: the API has no budget of its own)."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    anthropic_tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                       for t in (WEATHER, TIME)]
    for choice in ({"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather"}):
        body = {"max_tokens": 200, "messages": CHAT, "tools": anthropic_tools, "tool_choice": choice,
                "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 3}}
        r = thinking.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        uses = [b for b in r.json()["content"] if b["type"] == "tool_use"]
        assert uses and r.json()["stop_reason"] == "tool_use"
        if choice["type"] == "tool":
            assert [u["name"] for u in uses] == ["get_weather"]
        for use in uses:
            jsonschema.validate(use["input"], schemas[use["name"]])
    r = thinking.post("/v1/messages", json={"max_tokens": 5, "messages": CHAT, "tools": anthropic_tools,
                                            "tool_choice": {"type": "tool", "name": "nope"}})
    assert r.status_code == 400 and "nope" in r.text
    responses_tools = [{"type": "function", "name": "get_time", "parameters": TIME["function"]["parameters"]}]
    path = tmp_path / "qwen3.jinja"
    path.write_text(QWEN3_STYLE, encoding="utf-8")
    with TestClient(create_app(engine, ServerSettings(chat_template=str(path), reasoning_budget=4))) as c:
        r = c.post("/v1/responses", json={"input": "What time is it?", "tools": responses_tools,
                                          "tool_choice": "required", "parallel_tool_calls": False,
                                          "max_output_tokens": 200, "temperature": 0})
    assert r.status_code == 200, r.text
    calls = [item for item in r.json()["output"] if item["type"] == "function_call"]
    assert calls and all(c["name"] == "get_time" for c in calls)
    check(TIME["function"]["parameters"], calls[0]["arguments"])


# ---- Llama.create_chat_completion ------------------------------------------------------------

@pytest.fixture(scope="module")
def thinking_llama(smollm2_path):
    from ember import Llama
    from ember.chat import ChatTemplate
    with Llama(smollm2_path, n_ctx=512, n_threads=2, verbose=False) as model:
        model._chat_template = ChatTemplate(QWEN3_STYLE)
        yield model


def test_llama_thinks_within_its_budget_then_answers_as_asked(thinking_llama, llm):
    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "blue"]},
                                                          "minItems": 1, "maxItems": 2}},
              "required": ["colors"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    kw = dict(temperature=0, max_tokens=60, thinking_token_budget=5)
    message = thinking_llama.create_chat_completion(CHAT, response_format=fmt, **kw)["choices"][0]["message"]
    check(schema, message["content"])
    # The thought is the model's first five tokens, as unconstrained greedy decoding has them.
    free = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False, chat_template=QWEN3_STYLE)
    assert message["reasoning_content"] == free[0].outputs[0].reasoning_content
    deltas = [c["choices"][0]["delta"] for c in thinking_llama.create_chat_completion(CHAT, response_format=fmt,
                                                                                       stream=True, **kw)]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    with pytest.raises(ValueError, match="thinking_token_budget"):
        thinking_llama.create_chat_completion(CHAT, thinking_token_budget="5")
