"""Tool calls in a chat reply: the model's own spelling of a call to one of the request's tools,
turned into OpenAI's `tool_calls`. Models spell calls in one of three ways, and the chat template
that taught them says which:

- `hermes` (Hermes, Qwen 2.5 and 3, SmolLM3 and others): `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`, one block per call;
- `mistral`: `[TOOL_CALLS]` then a JSON array of {"name", "arguments"};
- `json` (Llama 3.1-3.3 and templates that only say "respond with JSON"): the whole reply is a
  JSON object {"name", "parameters" or "arguments"}, after an optional `<|python_tag|>`, several
  joined by ';'.

The reply's content is its text before the first call. A reply whose calls do not parse stays
content, as vLLM's parsers leave it."""
from __future__ import annotations

import json
import re
import uuid
from typing import List, Optional, Tuple

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


def _call(name, arguments) -> Optional[dict]:
    """OpenAI's tool call object, or None where name / arguments are not a call's."""
    if not isinstance(name, str) or not name:
        return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        return None
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": text}}


def _from_object(obj) -> Optional[dict]:
    if not isinstance(obj, dict):
        return None
    return _call(obj.get("name"), obj.get("arguments", obj.get("parameters")))


def _json_values(text: str, sep: str = "") -> Optional[list]:
    """The JSON values text holds one after another (separated by whitespace and `sep`), or None
    where anything else is left over."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and (text[i].isspace() or (sep and text[i] == sep)):
            i += 1
        if i == len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        values.append(value)


_LEADING_SPACE = re.compile(r"\s*")


def _hermes_objects(text: str) -> list:
    """The JSON value of each `<tool_call>` block, read by a JSON decoder rather than cut at the
    next close tag, since an argument string may itself hold `</tool_call>`; [] where a block is
    not one value then its close tag (or the end of the reply)."""
    decoder, objects, i = json.JSONDecoder(), [], text.find(HERMES_OPEN)
    while i >= 0:
        i = _LEADING_SPACE.match(text, i + len(HERMES_OPEN)).end()
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return []
        i = _LEADING_SPACE.match(text, i).end()
        if i < len(text) and not text.startswith(HERMES_CLOSE, i):
            return []
        objects.append(value)
        i = text.find(HERMES_OPEN, i)
    return objects


def _after_space(text: str) -> str:
    """The start of text past its leading whitespace (a few characters: enough to tell a call's
    opening, without copying a long reply at every streamed token)."""
    i = _LEADING_SPACE.match(text).end()
    return text[i:i + len(PYTHON_TAG)]


def _prefix_at_end(text: str, mark: str) -> int:
    """Where a proper prefix of mark ends text (it may grow into mark), else len(text)."""
    for n in range(min(len(mark) - 1, len(text)), 0, -1):
        if text.endswith(mark[:n]):
            return len(text) - n
    return len(text)


class ToolCallParser:
    """One syntax of tool calls (STYLES)."""

    STYLES = ("hermes", "mistral", "json")

    def __init__(self, style: str):
        if style not in self.STYLES:
            raise ValueError(f"tool call style {style!r} is not one of {self.STYLES}")
        self.style = style

    @classmethod
    def for_template(cls, source: str) -> "ToolCallParser":
        """The syntax a chat template teaches its model."""
        if HERMES_OPEN in source:
            return cls("hermes")
        if MISTRAL_MARK in source:
            return cls("mistral")
        return cls("json")

    def _start(self, text: str) -> int:
        """Where the first call begins in text, -1 where none does."""
        if self.style == "hermes":
            return text.find(HERMES_OPEN)
        if self.style == "mistral":
            return text.find(MISTRAL_MARK)
        return 0 if _after_space(text).startswith(("{", "[", PYTHON_TAG)) else -1

    def held_from(self, text: str) -> int:
        """While a reply streams: the part of text from here on may belong to a call, so it is held
        back until the reply ends (a JSON-style reply that starts like a call is held whole)."""
        start = self._start(text)
        if start >= 0:
            return start
        if self.style == "json":
            head = _after_space(text)
            return 0 if PYTHON_TAG.startswith(head) else len(text)
        return _prefix_at_end(text, HERMES_OPEN if self.style == "hermes" else MISTRAL_MARK)

    def split(self, text: str) -> Tuple[int, List[dict]]:
        """(where the calls start, OpenAI's tool call objects) of a whole reply; (len(text), [])
        where no call parses."""
        start = self._start(text)
        calls = self._calls(text[start:]) if start >= 0 else []
        return (start, calls) if calls else (len(text), [])

    def parse(self, text: str) -> Tuple[Optional[str], List[dict]]:
        """(content, calls) of a whole reply: content is the text before the first call (None where
        only whitespace is); (text, []) where no call parses."""
        start, calls = self.split(text)
        if not calls:
            return text, []
        return (text[:start] if text[:start].strip() else None), calls

    def _calls(self, text: str) -> List[dict]:
        if self.style == "hermes":
            objects = _hermes_objects(text)
        elif self.style == "mistral":
            values = _json_values(text[len(MISTRAL_MARK):])
            if not values or len(values) != 1:
                return []
            objects = values[0] if isinstance(values[0], list) else [values[0]]
        else:
            body = text.lstrip()
            values = _json_values(body[len(PYTHON_TAG):] if body.startswith(PYTHON_TAG) else body, ";")
            if not values:
                return []
            objects = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        calls = [_from_object(o) for o in objects]
        return calls if calls and all(calls) else []


def spell_calls(style: str, calls: list) -> str:
    """Tool calls (OpenAI's objects, arguments as objects or JSON strings) written in a style's own
    syntax, as the model would have written them."""
    objects = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            continue
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        objects.append({"name": fn.get("name"), "arguments": args if args is not None else {}})
    if style == "hermes":
        return "\n".join(f"{HERMES_OPEN}\n{json.dumps(o, ensure_ascii=False)}\n{HERMES_CLOSE}" for o in objects)
    if style == "mistral":
        return MISTRAL_MARK + json.dumps(objects, ensure_ascii=False)
    return "; ".join(json.dumps({"name": o["name"], "parameters": o["arguments"]}, ensure_ascii=False)
                     for o in objects)


def arguments_as_objects(messages: list, template_source: Optional[str] = None) -> list:
    """Messages as Hugging Face chat templates expect them: each assistant tool call's `arguments`
    JSON string (what OpenAI clients send) read into an object (strings that are not JSON objects
    stay as they are), and an assistant's null `content` (a turn of tool calls alone, as the SDKs
    send it back) as "", since templates concatenate it. Given the template's source, a template
    that never reads `tool_calls` gets the calls written into the content in the syntax it
    teaches, so the model still sees what it called (llama-server does the same)."""
    renders_calls = template_source is None or "tool_calls" in template_source
    out = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        args = None
                    if isinstance(args, dict):
                        c = dict(c, function=dict(fn, arguments=args))
                fixed.append(c)
            m = dict(m, tool_calls=fixed)
            if not renders_calls and fixed:
                style = ToolCallParser.for_template(template_source).style
                text = m.get("content") or ""
                m["content"] = (text + "\n" if text else "") + spell_calls(style, fixed)
        if m.get("role") == "assistant" and "content" in m and m["content"] is None:
            m = dict(m, content="")
        out.append(m)
    return out
