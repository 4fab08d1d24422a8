"""Tool calls in chat replies (ember/chat/tool_calls.py): each model family's call syntax parsed
into OpenAI's tool_calls, replies that only look like calls left as content, the request fields
(tools, tool_choice, parallel_tool_calls) checked, and the chat responses built from them, whole
and streamed (ember/server/responses.py). No model is needed: replies are given as text."""
import json

import pytest

from ember.outputs import CompletionOutput, RequestOutput
from ember.server.openai_schema import APIError, parse_chat
from ember.server.responses import ResponseBuilder
from ember.chat import ToolCallParser, arguments_as_objects

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = [{"role": "user", "content": "Weather in Paris and Oslo?"}]


def fn(call):
    return call["function"]["name"], json.loads(call["function"]["arguments"])


@pytest.mark.parametrize("style,text,content,calls", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None,
     [("get_weather", {"city": "Paris"})]),
    ("hermes", 'Let me look.\n<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
               '<tool_call>{"name": "b", "arguments": {}}</tool_call>', "Let me look.\n",
     [("a", {"x": 1}), ("b", {})]),
    ("hermes", '<tool_call>{"name": "a", "arguments": {"x": "é"}}', None, [("a", {"x": "é"})]),   # not closed (EOS)
    # a string argument holding the close tag (a sampled forced call did this): the call is read whole
    ("hermes", '<tool_call>\n{"name": "w", "arguments": {"city": "}}</tool_call> -- a ", "unit": "C"}}\n</tool_call>',
     None, [("w", {"city": "}}</tool_call> -- a ", "unit": "C"})]),
    ("mistral", '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [2]}}]', None,
     [("a", {"x": 1}), ("b", {"y": [2]})]),
    ("json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None, [("get_weather", {"city": "Oslo"})]),
    ("json", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"k": true}}', None,
     [("a", {}), ("b", {"k": True})]),
    ("json", ' [{"name": "a", "arguments": {}}]', None, [("a", {})]),
])
def test_each_syntax_parses(style, text, content, calls):
    got_content, got = ToolCallParser(style).parse(text)
    assert got_content == content
    assert [fn(c) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)
    assert len({c["id"] for c in got}) == len(got)


@pytest.mark.parametrize("style,text", [
    ("hermes", "The weather is fine."),
    ("hermes", '<tool_call>{"name": "a", "arguments": {"x": </tool_call>'),   # broken JSON
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),                   # no name
    ("hermes", '<tool_call>["a"]</tool_call>'),
    ("hermes", '<tool_call>{"name": "a", "arguments": {}} trailing words</tool_call>'),
    ("mistral", "[TOOL_CALLS] not json"),
    ("json", '{"name": "a", "parameters": {}} and then some text'),
    ("json", '{"city": "Paris"}'),
    ("json", "Plain words."),
])
def test_replies_that_do_not_parse_stay_content(style, text):
    assert ToolCallParser(style).parse(text) == (text, [])


def test_the_template_picks_the_syntax():
    assert ToolCallParser.for_template("{{ '<tool_call>' }}{{ tools | tojson }}").style == "hermes"
    assert ToolCallParser.for_template("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]").style == "mistral"
    assert ToolCallParser.for_template("{{ messages }}").style == "json"
    with pytest.raises(ValueError, match="style"):
        ToolCallParser("xml")


@pytest.mark.parametrize("style,text,held", [
    ("hermes", "Sure", 4),
    ("hermes", "Sure <tool", 5),             # may grow into the marker
    ("hermes", "Sure <toolbox>", 14),
    ("hermes", "Sure <tool_call>{", 5),
    ("mistral", "[TOOL", 0),
    ("json", "", 0),
    ("json", "  {", 0),
    ("json", "<|python", 0),
    ("json", "Hello", 5),
])
def test_streaming_holds_back_what_may_be_a_call(style, text, held):
    assert ToolCallParser(style).held_from(text) == held


def test_assistant_arguments_reach_the_template_as_objects():
    messages = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    out = arguments_as_objects(messages)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert out[0]["tool_calls"][1]["function"]["arguments"] == "not json"
    assert out[1] == messages[1]
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'   # the request is not changed


def chat_request(**fields):
    return parse_chat(dict({"messages": CHAT}, **fields), 1000)


def test_request_fields():
    assert chat_request().tool_choice == "none"
    req = chat_request(tools=[WEATHER])
    assert (req.tool_choice, req.parallel_tool_calls, req.tools) == ("auto", True, [WEATHER])
    assert chat_request(tools=[WEATHER], tool_choice="none").tool_choice == "none"
    assert chat_request(tools=[WEATHER], parallel_tool_calls=False).parallel_tool_calls is False


@pytest.mark.parametrize("fields,param,words", [
    ({"tools": [{"type": "function"}]}, "tools[0]", "each tool"),
    ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools[0]", "each tool"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name", "non-empty"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]}, "tools[0].function.parameters",
     "JSON Schema"),
    ({"tools": {"a": 1}}, "tools", "array"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "not one of"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "not among 'tools'"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tool_choice": "auto"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
])
def test_bad_tool_fields_name_the_field(fields, param, words):
    with pytest.raises(APIError) as e:
        chat_request(**fields)
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def outputs(text, finish="stop"):
    return RequestOutput("r", None, [1, 2], None, [CompletionOutput(0, text, [5] * 3, None, None, finish)],
                         finish is not None)


def builder(style="hermes", **fields):
    req = chat_request(tools=[WEATHER], **fields)
    return ResponseBuilder(req, "m", None, ["prompt"], True, ToolCallParser(style))


TWO_CALLS = ('Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
             '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')


def test_whole_response_with_calls():
    choice = builder().response([outputs(TWO_CALLS)])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."
    assert [fn(c) for c in choice["message"]["tool_calls"]] == [("get_weather", {"city": "Paris"}),
                                                                ("get_weather", {"city": "Oslo"})]
    one = builder(parallel_tool_calls=False).response([outputs(TWO_CALLS)])["choices"][0]
    assert [fn(c) for c in one["message"]["tool_calls"]] == [("get_weather", {"city": "Paris"})]


def test_whole_response_without_calls():
    choice = builder().response([outputs("It is sunny.")])["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is sunny."}
    assert choice["finish_reason"] == "stop"
    cut = builder().response([outputs('<tool_call>{"name": "get_wea', "length")])["choices"][0]
    assert cut["finish_reason"] == "length" and "tool_calls" not in cut["message"]


def stream(b, texts):
    """The chunks of a reply that grows through texts (the last one finished)."""
    chunks = []
    for k, t in enumerate(texts):
        chunks += b.chunks(0, outputs(t, "stop" if k == len(texts) - 1 else None))
    return [c["choices"][0] for c in chunks]


def test_streamed_calls_come_whole_after_the_content():
    texts = [TWO_CALLS[:n] for n in (4, 9, 12, 20, 60, 100)] + [TWO_CALLS]
    choices = stream(builder(), texts)
    content = "".join(c["delta"].get("content", "") for c in choices)
    assert content == "Checking."
    calls = [c["delta"]["tool_calls"] for c in choices if "tool_calls" in c["delta"]]
    assert len(calls) == 1 and [d["index"] for d in calls[0]] == [0, 1]
    assert [fn(d) for d in calls[0]] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert all(c["finish_reason"] is None for c in choices[:-1])


def test_streamed_reply_that_only_looked_like_a_call_is_sent_whole():
    text = "Use <tool_call> tags, they said."
    choices = stream(builder(), [text[:6], text[:12], text])
    assert "".join(c["delta"].get("content", "") for c in choices) == text
    assert choices[-1]["finish_reason"] == "stop"
    assert not any("tool_calls" in c["delta"] for c in choices)


def test_streamed_json_style_holds_the_reply_until_it_ends():
    text = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    choices = stream(builder("json"), [text[:1], text[:20], text])
    assert not any(c["delta"].get("content") for c in choices)
    assert [fn(d) for c in choices for d in c["delta"].get("tool_calls", [])] == [("get_weather", {"city": "Oslo"})]
    plain = stream(builder("json"), ["Hel", "Hello"])
    assert "".join(c["delta"].get("content", "") for c in plain) == "Hello"
