"""What a request body asks its reply to be: OpenAI's response_format (json_object, json_schema),
vLLM's structured_outputs and guided_* fields, llama-server's grammar and json_schema, forced tool
calls (tool_choice "required" or a named function) and the thinking budget, checked into a Constraint
(a 400 naming the field before anything runs), then, once the chat template has written the prompt,
the request's StructuredOutputsParams: the answer's constraint after the model's thinking
(ember.chat.constrain)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Optional

from ..chat import constrain
from ..chat.reasoning import ReasoningParser
from ..structured import StructuredOutputsParams
from .openai_schema import bad_param

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# vLLM's older per-field spellings of structured_outputs' kinds.
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


@dataclass
class Constraint:
    """field: the body field that asked (400s name it); kind / value: one of KINDS and its value
    (StructuredOutputsParams' field); options: StructuredOutputsParams' other fields."""
    field: str
    kind: str
    value: Any
    options: dict


def _schema(value, field: str):
    """A JSON schema given as an object or as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise bad_param(field, f"'{field}' is not valid JSON: {e}") from None
    if not isinstance(value, (dict, bool)):
        raise bad_param(field, f"'{field}' must be a JSON schema (an object), got {json.dumps(value)[:100]}")
    return value


def _response_format(fmt: dict) -> Optional[Constraint]:
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":   # llama-server's may carry a schema
        schema = fmt.get("schema")
        if schema is not None:
            return Constraint("response_format.schema", "json", _schema(schema, "response_format.schema"), {})
        return Constraint("response_format", "json_object", True, {})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise bad_param("response_format.json_schema", "response_format 'json_schema' needs "
                                                           "{'json_schema': {'name': ..., 'schema': {...}}}")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_param("response_format.json_schema.strict", "'response_format.json_schema.strict' must be "
                                                                  "a boolean")
        return Constraint("response_format.json_schema.schema", "json",
                          _schema(spec["schema"], "response_format.json_schema.schema"), {})
    raise bad_param("response_format", f"response_format type {kind!r} is not one of 'text', 'json_object', "
                                       f"'json_schema'")


def _structured_outputs(spec: dict) -> Constraint:
    given = [k for k in KINDS if spec.get(k) not in (None, False)]
    unknown = sorted(set(spec) - set(KINDS) - set(_OPTIONS))
    if unknown:
        raise bad_param("structured_outputs", f"'structured_outputs' has unknown fields {', '.join(unknown)} "
                                              f"(it takes one of {', '.join(KINDS)})")
    if len(given) != 1:
        raise bad_param("structured_outputs", f"'structured_outputs' needs exactly one of {', '.join(KINDS)}, "
                                              f"got {', '.join(given) or 'none'}")
    kind = given[0]
    options = {k: spec[k] for k in _OPTIONS if spec.get(k) is not None}
    return Constraint(f"structured_outputs.{kind}", kind, _value(kind, spec[kind], f"structured_outputs.{kind}"),
                      options)


def _value(kind: str, value, field: str):
    if kind == "json":
        return _schema(value, field)
    if kind in ("regex", "grammar") and not (isinstance(value, str) and value):
        raise bad_param(field, f"'{field}' must be a non-empty string")
    if kind == "choice" and not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
        raise bad_param(field, f"'{field}' must be a non-empty array of strings")
    return value


def parse_constraint(body: dict) -> Optional[Constraint]:
    """The body's constraint on its reply, or None; a 400 where it asks in more than one way or a
    field is malformed (the schema or grammar itself is compiled by build)."""
    found: List[Constraint] = []
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise bad_param("response_format", "'response_format' must be an object such as {'type': 'json_object'}")
        c = _response_format(fmt)
        if c is not None:
            found.append(c)
    spec = body.get("structured_outputs")
    if spec is not None:
        if not isinstance(spec, dict):
            raise bad_param("structured_outputs", "'structured_outputs' must be an object")
        found.append(_structured_outputs(spec))
    for field, kind in _GUIDED.items():
        if body.get(field) is not None:
            options = {"whitespace_pattern": body["guided_whitespace_pattern"]} \
                if isinstance(body.get("guided_whitespace_pattern"), str) else {}
            found.append(Constraint(field, kind, _value(kind, body[field], field), options))
    if body.get("grammar") is not None:   # llama-server's GBNF
        found.append(Constraint("grammar", "grammar", _value("grammar", body["grammar"], "grammar"), {}))
    if body.get("json_schema") is not None:   # llama-server's
        found.append(Constraint("json_schema", "json", _schema(body["json_schema"], "json_schema"), {}))
    if len(found) > 1:
        raise bad_param(found[1].field, f"the reply is constrained twice ({found[0].field} and {found[1].field}); "
                                        f"give one")
    return found[0] if found else None


def _check(params: StructuredOutputsParams, field: str) -> StructuredOutputsParams:
    try:
        return params.check()
    except (TypeError, ValueError) as e:
        raise bad_param(field, f"'{field}': {e}") from None


def direct(c: Constraint) -> StructuredOutputsParams:
    """The constraint as it is, on the whole reply (completions; chat replies without thinking)."""
    return _check(StructuredOutputsParams(**{c.kind: c.value}, **c.options), c.field)


def _answer(c: Constraint) -> constrain.Answer:
    try:
        return constrain.answer(c.kind, c.value)
    except ValueError as e:
        raise bad_param(c.field, f"'{c.field}': {e}") from None


@dataclass
class ChatConstraint:
    """A chat request's constraints: c (the reply's, or None); tools: those a call may name (None:
    no calls constrained); required: the reply must be calls (else they are constrained lazily, from
    a call's opening on); parallel: several calls may come; budget: tokens of thinking (None: any)."""
    c: Optional[Constraint] = None
    tools: Optional[list] = None
    required: bool = False
    parallel: bool = True
    budget: Optional[int] = None


def build_chat(cc: ChatConstraint, reasoning: ReasoningParser, prompt: str, tool_style: str, spell):
    """The StructuredOutputsParams of a chat reply to prompt (the rendered template), or None. The
    constraint is composed into one grammar where the reply thinks first or calls tools; a 400
    names the field whose schema or grammar does not compile. spell: ember.chat.constrain.spelling's,
    for the tokenizer."""
    if cc.required and cc.tools:
        answer, field = constrain.tool_answer(tool_style, cc.tools, cc.parallel, lazy=False, spell=spell), "tools"
    elif cc.c is not None:
        if not reasoning.active or cc.c.kind == "structural_tag":
            return direct(cc.c)
        answer, field = _answer(cc.c), cc.c.field
    elif cc.tools and tool_style != "json":
        answer, field = constrain.tool_answer(tool_style, cc.tools, cc.parallel, lazy=True, spell=spell), "tools"
    else:
        answer, field = None, "thinking_token_budget"
    text = constrain.grammar(answer, constrain.Thought(reasoning, prompt, spell), cc.budget)
    if text is None:
        return None
    if cc.c is not None and field == cc.c.field:
        direct(cc.c)   # the answer's own errors named as they would be alone
    return _check(StructuredOutputsParams(grammar=text), field)
