"""The grammar of one chat reply, in llguidance's Lark syntax, where a plain constraint is not enough:
the answer's constraint (a JSON schema, a regex, a choice, a grammar, tool calls) after the model's
thinking, thinking cut off after a budget of tokens, and tool calls constrained only once the model
starts one (free text stays free). ember.structured compiles the text; this module only writes it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional

from ..structured import StructuredOutputsParams
from .reasoning import ReasoningParser
from .tool_calls import HERMES_CLOSE, HERMES_OPEN, MISTRAL_MARK

_ANY = "/(?s:.*)/"
_SPACE = r"/[ \t\r\n]{0,4}/"   # between a closed thought and the answer: the model's newlines, a few at most


@dataclass(frozen=True)
class Answer:
    """What the answer must be: `rule`, a Lark expansion of the rule `answer`, with any rules of its
    own (`rules`, Lark lines); it may name `@user`, a grammar of its own (`side`, Lark)."""
    rule: str
    rules: str = ""
    side: Optional[str] = None


FREE = Answer("ANSWER_TEXT")   # anything (a thinking budget alone)


def literal(s: str) -> str:
    """s as a Lark string: its text, whichever tokens spell it."""
    return json.dumps(s, ensure_ascii=False)


def spelling(tok):
    """spell(text) for a tokenizer (an _ember.Tokenizer): `<[id]>` where text is one special token
    of it (a grammar's text never matches those), else the literal."""
    def spell(text: str) -> str:
        ids = list(tok.encode(text.encode("utf-8"), False, True))
        return f"<[{ids[0]}]>" if len(ids) == 1 and tok.is_special(ids[0]) else literal(text)
    return spell


def _is_token(spelled: str) -> bool:
    return spelled.startswith("<[")   # a special token, by id (`<[id]>`)


# JSON laid out as ember.structured lays it out: compact, ", " and ": " between items (free
# whitespace lets small models pad forever).
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NEWLINE = literal("\n")


def _json(schema) -> str:
    if isinstance(schema, dict):
        schema = dict(schema, **{"x-guidance": dict(_LAYOUT, **schema.get("x-guidance", {}))})
    return "%json " + json.dumps(schema, ensure_ascii=False)


def json_answer(schema) -> Answer:
    return Answer(_json(schema))


def regex_answer(pattern: str) -> Answer:
    return Answer("/" + pattern.replace("/", "\\/") + "/")


def choice_answer(choices: List[str]) -> Answer:
    return Answer(" | ".join(literal(c) for c in choices))


def grammar_answer(text: str) -> Answer:
    """A user's grammar (GBNF or Lark), nested as @user; ValueError where it does not convert."""
    from llguidance.gbnf_to_lark import any_to_lark

    from ..structured import gbnf_lark, is_gbnf
    try:
        return Answer("@user", side=gbnf_lark(text, any_to_lark) if is_gbnf(text) else any_to_lark(text))
    except Exception as e:   # the converter raises bare Exceptions naming the rule
        raise ValueError(f"the grammar does not parse: {e}") from None


KINDS = ("json", "json_object", "regex", "choice", "grammar")   # StructuredOutputsParams' fields composed here


def answer(kind: str, value) -> Answer:
    """The answer of a StructuredOutputsParams field (KINDS) and its value; ValueError where a
    grammar does not convert."""
    if kind == "json":
        return json_answer(json.loads(value) if isinstance(value, str) else value)
    if kind == "json_object":
        return json_answer({"type": "object"})
    if kind == "regex":
        return regex_answer(value)
    if kind == "choice":
        return choice_answer(value)
    if kind == "grammar":
        return grammar_answer(value)
    raise ValueError(f"a {kind} constraint cannot follow a model's thinking")


def answer_of(params) -> Optional[Answer]:
    """The answer a StructuredOutputsParams asks for, None where it cannot be composed (a
    structural tag: it already waits for its trigger)."""
    kind = next((k for k in KINDS if getattr(params, k, None) not in (None, False)), None)
    return answer(kind, getattr(params, kind)) if kind is not None else None


def call_schema(tools: list, arguments_key: str = "arguments") -> dict:
    """A JSON schema of one call to any of tools (OpenAI's tool objects): its name, then arguments
    valid for that tool's parameters."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, arguments_key: params},
                        "required": ["name", arguments_key], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_answer(style: str, tools: list, parallel: bool, lazy: bool, spell=literal) -> Answer:
    """Calls in a tool call style's syntax (ember.chat.tool_calls). lazy (tool_choice "auto"): free
    text, each call constrained from its opening tag on; else (required, or one named tool) the
    reply is calls only. spell(text): a tag's Lark spelling (`<[id]>` where the vocabulary has it
    as one special token)."""
    if style == "hermes":
        opening, closing = spell(HERMES_OPEN), spell(HERMES_CLOSE)
        body = f"{_NEWLINE} {_json(call_schema(tools))} {_NEWLINE} {closing}"
        if lazy:
            # Free text up to the opening tag, then a call: a special token ends the text of itself;
            # text ends at the tag's first occurrence ([lazy]).
            rules = f"hermes_call: ANSWER_TEXT {opening} {body}" if _is_token(opening) else \
                f"hermes_open[lazy]: ANSWER_TEXT {opening}\nhermes_call: hermes_open {body}"
            return Answer("hermes_call* ANSWER_TEXT", rules=rules)
        call = f"{opening} {body}"
        return Answer(f'{call} ("\\n" {call})*' if parallel else call)
    if style == "mistral":
        mark = spell(MISTRAL_MARK)
        calls = {"type": "array", "items": call_schema(tools), "minItems": 1}
        if not parallel:
            calls["maxItems"] = 1
        body = f"{mark} {_json(calls)}"
        return Answer(f"ANSWER_TEXT {body} | ANSWER_TEXT" if lazy else body)
    call = _json(call_schema(tools, "parameters"))
    calls = f'{call} (";" " "? {call})*' if parallel else call
    if lazy:
        # A JSON-style reply is a call when it opens with "{" (llama.cpp triggers these styles' lazy
        # grammars the same way): such a reply is calls, any other is free text.
        return Answer(f"{calls} | NOT_A_CALL", rules="NOT_A_CALL: ANSWER_TEXT & ~/[ \\t\\r\\n]*\\{(?s:.*)/")
    return Answer(calls)


class Thought:
    """How a reply's thinking shows to the grammar: its parser, the prompt it answers (a template
    may open the thought in the prompt), and spell(text), a tag's Lark spelling (`<[id]>` where the
    vocabulary has it as one special token)."""

    def __init__(self, parser: ReasoningParser, prompt: str, spell=literal):
        self.parser = parser
        self.in_thought = parser.starts_in_thought(prompt)
        self.spell = spell


def _text_rule(open_tag: Optional[str]) -> str:
    """ANSWER_TEXT: any text; where a thought may still open, text that does not open one (so the
    thought's branch, with its budget, is the only way to think)."""
    if open_tag is None:
        return f"ANSWER_TEXT: {_ANY}"
    return f"ANSWER_TEXT: {_ANY} & ~/[ \\t\\r\\n]*{_regex_literal(open_tag)}(?s:.*)/"


def _regex_literal(s: str) -> str:
    out = []
    for ch in s:
        out.append("\\" + ch if ch in r"\.^$|?*+()[]{}/" else ch)
    return "".join(out)


def grammar(answer: Optional[Answer], thought: Optional[Thought] = None, budget: Optional[int] = None) -> Optional[str]:
    """The reply's grammar (Lark, or llguidance's JSON form when the answer nests a grammar), or
    None where nothing constrains it. budget: tokens the thinking may take before its closing tag
    is forced."""
    parser = thought.parser if thought is not None else None
    thinks = parser is not None and parser.active
    if answer is None and (budget is None or not thinks):
        return None
    answer = answer or FREE
    lines = ["%llguidance {}"]
    may_open = thinks and not thought.in_thought
    if not thinks:
        lines.append("start: answer")
    elif parser.name == "gpt_oss":
        lines += _harmony_rules(budget)
    else:
        tags = parser.tags
        think = f"think[max_tokens={budget}]: THINK_TEXT" if budget is not None else "think: THINK_TEXT"
        lines += [think,
                  f"THINK_TEXT: {_ANY} & ~/(?s:.*){_regex_literal(tags.close)}(?s:.*)/",
                  f"thought: think {thought.spell(tags.close)} {_SPACE}"]
        if thought.in_thought:
            lines.append("start: thought answer")
        else:
            lines.append(f"start: /[ \\t\\r\\n]*/ {thought.spell(tags.open)} thought answer | answer")
    lines.append(f"answer: {answer.rule}")
    if answer.rules:
        lines.append(answer.rules)
    open_tag = parser.tags.open if may_open and parser.tags is not None else None
    lines.append(_text_rule(open_tag))
    text = "\n".join(lines) + "\n"
    if answer.side is None:
        return text
    return json.dumps({"grammars": [{"lark_grammar": text}, {"name": "user", "lark_grammar": answer.side}]})


def _harmony_rules(budget: Optional[int]) -> List[str]:
    """gpt-oss: an optional analysis message, then the final channel, whose text is the answer."""
    think = f"think[max_tokens={budget}]: HARMONY_TEXT" if budget is not None else "think: HARMONY_TEXT"
    return [think, "HARMONY_TEXT: /(?s:.*)/",
            'analysis: <|channel|> "analysis" <|message|> think <|end|> <|start|> "assistant"',
            'start: analysis? <|channel|> "final" <|message|> answer']


def after_thinking(params, parser: ReasoningParser, prompt: str, budget: Optional[int], spell=literal):
    """params (a StructuredOutputsParams, or None) applied to the answer of a reply to prompt, after
    its thinking, which budget tokens end (None: no limit): the same params where the reply cannot
    think or nothing is to compose, else a StructuredOutputsParams of one grammar. spell: as
    Thought's."""
    if not parser.active:
        return params
    answer_ = answer_of(params) if params is not None else None
    if params is not None and answer_ is None:
        return params
    text = grammar(answer_, Thought(parser, prompt, spell), budget)
    return params if text is None else StructuredOutputsParams(grammar=text)
