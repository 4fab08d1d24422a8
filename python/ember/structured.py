"""Constrained decoding's Python side: vLLM's `StructuredOutputsParams`, llama-cpp-python's
`LlamaGrammar` and OpenAI's response_format, each turned into one llguidance grammar (checked, and
cached per spec) that the engine and `Llama` compile against the model's vocabulary. JSON is laid
out compactly (", " and ": " between items, no other whitespace) unless whitespace_pattern says
otherwise: free whitespace lets small models pad forever."""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

from . import _ember

# The engine's and GrammarCompiler's kind for what grammar_spec() returns.
KIND = "llguidance"
_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def llguidance():
    """The llguidance module, its C API loaded into ember's core (once a process)."""
    try:
        import llguidance as llg
        import llguidance._lib as lib
    except ImportError as e:
        raise ImportError("constrained decoding (structured outputs, grammars) needs llguidance: "
                          "pip install llguidance") from e
    if not _ember.llguidance_loaded():
        _ember.load_llguidance(lib.__file__)
    return llg


def _checked(where: str, grammar: str) -> str:
    is_error, messages = llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"{where}: {messages[0].strip()}")
    return grammar


def _json_options(whitespace_pattern: Optional[str]) -> dict:
    if whitespace_pattern is not None:
        return {"whitespace_flexible": False, "whitespace_pattern": whitespace_pattern}
    return {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _schema_value(where: str, schema) -> Union[dict, bool]:
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"{where}: the schema is not valid JSON: {e}") from None
    if hasattr(schema, "model_json_schema"):   # a pydantic model class
        schema = schema.model_json_schema()
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{where}: a JSON schema is an object (dict) or a bool, got {type(schema).__name__}")
    return schema


@functools.lru_cache(maxsize=512)
def _schema_grammar(where: str, schema_text: str, whitespace_pattern: Optional[str], no_additional: bool) -> str:
    llg = llguidance()
    schema = json.loads(schema_text)
    options = _json_options(whitespace_pattern)
    if no_additional and isinstance(schema, dict):
        schema = _close_objects(schema)
    return _checked(where, llg.LLMatcher.grammar_from_json_schema(schema, overrides=options))


def _close_objects(schema):
    """vLLM's disable_additional_properties: objects take only their listed properties unless the
    schema says otherwise."""
    if isinstance(schema, list):
        return [_close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _close_objects(v) for k, v in schema.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def is_gbnf(text: str) -> bool:
    """llama.cpp's GBNF (rules `name ::= ...`) rather than llguidance's Lark (`name: ...`)."""
    return "::=" in text


def _plain_unicode_escapes(gbnf: str) -> str:
    """llguidance's GBNF converter drops a \\u or \\U escape's leading zeros, which its regexes then
    refuse (\\u0085 becomes \\u85): such escapes are written as \\xNN or as the character itself."""
    def one(m):
        body = m.group(1)
        if body == "\\" or body[1] != "0":
            return m.group(0)
        code = int(body[1:], 16)
        return f"\\x{code:02x}" if code < 0x80 else chr(code)
    return re.sub(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})", one, gbnf)


# A Lark grammar's strings, comments, regexes and upper-case names, in the order they start.
_LARK_PIECE = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/(?:\\.|[^/\\\n])+/[imsx]*|\b[A-Z][A-Z0-9_]*\b')


def _character_level(lark: str) -> str:
    """gbnf_to_lark's output with its terminal rules (upper-case: rules of characters only) made
    parser rules. llguidance lexes a terminal greedily, longest match first, where llama.cpp matches
    a GBNF grammar character by character with every parse kept: in `num ::= [0-9]+ ws` followed by
    "\n", a greedy NUM would swallow the newline the line needs. As parser rules, each character
    class is a lexeme of one character and the grammar's language is GBNF's."""
    terminals = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*:", lark, re.M))

    def rename(m):
        piece = m.group(0)
        return piece.lower() + "_" if piece in terminals else piece
    return _LARK_PIECE.sub(rename, lark)


def gbnf_lark(gbnf: str, convert) -> str:
    """GBNF as Lark with llama.cpp's matching (_character_level), through llguidance's converter
    `convert` (gbnf_to_lark or any_to_lark); ValueError, the converter's words on what does not parse."""
    try:
        return _character_level(convert(_plain_unicode_escapes(gbnf)))
    except Exception as e:   # the converter raises plain Exceptions naming the rule
        raise ValueError(str(e)) from None


@functools.lru_cache(maxsize=512)
def _grammar_grammar(where: str, text: str) -> str:
    llg = llguidance()
    if text.lstrip().startswith("{"):   # llguidance's own JSON form ({"grammars": [...]}), as it is
        return _checked(where, text)
    lark = text
    if is_gbnf(text):
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            lark = gbnf_lark(text, gbnf_to_lark)
        except ValueError as e:
            raise ValueError(f"{where}: invalid GBNF grammar: {e}") from None
    return _checked(where, llg.LLMatcher.grammar_from_lark(lark))


@functools.lru_cache(maxsize=512)
def _regex_grammar(where: str, regex: str) -> str:
    return _checked(where, llguidance().LLMatcher.grammar_from_regex(regex))


def _lark_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _structural_tag_grammar(where: str, tag, whitespace_pattern: Optional[str]) -> str:
    """vLLM's structural tag ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}): free
    text until a trigger, then one structure's begin, its schema's JSON and its end; then free
    text again (tool calls constrained only once the model starts one)."""
    llg = llguidance()
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except ValueError as e:
            raise ValueError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(tag, dict) or not isinstance(tag.get("structures"), list) or not tag["structures"]:
        raise ValueError(f"{where}: expected {{'structures': [{{'begin', 'schema', 'end'}}, ...], 'triggers': [...]}}")
    triggers = tag.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError(f"{where}: 'triggers' must be a non-empty list of non-empty strings")
    tags = []
    for i, st in enumerate(tag["structures"]):
        if not isinstance(st, dict) or not isinstance(st.get("begin"), str) or not isinstance(st.get("end", ""), str):
            raise ValueError(f"{where}: structures[{i}] needs a 'begin' string, a 'schema' and an 'end' string")
        trigger = next((t for t in triggers if st["begin"].startswith(t)), None)
        if trigger is None:
            raise ValueError(f"{where}: structures[{i}]'s begin {st['begin']!r} starts with none of the triggers "
                             f"{triggers!r}")
        schema = _schema_value(f"{where}: structures[{i}].schema", st.get("schema", {}))
        if isinstance(schema, dict):
            schema = dict(schema, **{"x-guidance": _json_options(whitespace_pattern)})
        tags.append(llg.StructTag(trigger=trigger, begin=st["begin"], grammar=schema, end=st.get("end", "")))
    text = llg.StructTag.to_grammar(tags)
    grammar = text if text.lstrip().startswith("{") else llg.LLMatcher.grammar_from_lark(text)
    return _checked(where, grammar)


@dataclass
class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams: exactly one of json (a JSON schema: dict, JSON text or a
    pydantic model class), regex, choice (a list of strings), grammar (llama.cpp's GBNF, or
    llguidance's Lark or its JSON form {"grammars": [...]}), json_object (any JSON object) or
    structural_tag (vLLM's: free text, and a schema after each trigger). whitespace_pattern: the
    whitespace JSON may have between tokens (default: none but ", " and ": ");
    disable_additional_properties: objects take only their listed properties unless the schema
    says otherwise. disable_any_whitespace is taken and changes nothing (JSON is compact already),
    as is disable_fallback (there is one backend)."""
    json: Optional[Union[str, dict, Any]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[Union[str, dict]] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None

    def __post_init__(self):
        given = [f for f in _FIELDS if getattr(self, f) not in (None, False)]
        if len(given) != 1:
            raise ValueError("StructuredOutputsParams: give exactly one of json, regex, choice, grammar, json_object "
                             f"and structural_tag, got {given or 'none'}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError(f"StructuredOutputsParams: regex must be a string, got {type(self.regex).__name__}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("StructuredOutputsParams: grammar must be a non-empty string (GBNF or Lark)")
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise ValueError(f"StructuredOutputsParams: choice must be a non-empty list of strings, "
                                 f"got {self.choice!r}")
            self.choice = list(self.choice)
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError("StructuredOutputsParams: whitespace_pattern must be a regex string")

    def grammar_spec(self) -> Tuple[str, str]:
        """(kind, grammar) for the engine's add_request and GrammarCompiler.compile. ValueError
        naming the field and what is wrong with it; cached, so a repeated spec costs nothing."""
        ws = self.whitespace_pattern
        if self.json is not None:
            where = "structured_outputs.json"
            schema = _schema_value(where, self.json)
            return KIND, _schema_grammar(where, json.dumps(schema), ws,
                                         self.disable_additional_properties)
        if self.json_object:
            return KIND, _schema_grammar("structured_outputs.json_object", '{"type": "object"}', ws, False)
        if self.regex is not None:
            return KIND, _regex_grammar("structured_outputs.regex", self.regex)
        if self.choice is not None:
            lark = "start: " + " | ".join(_lark_string(c) for c in self.choice)
            return KIND, _grammar_grammar("structured_outputs.choice", lark)
        if self.grammar is not None:
            return KIND, _grammar_grammar("structured_outputs.grammar", self.grammar)
        return KIND, _structural_tag_grammar("structured_outputs.structural_tag", self.structural_tag, ws)

    def check(self) -> "StructuredOutputsParams":
        """Raises ValueError naming what is wrong (an invalid schema, grammar or regex)."""
        self.grammar_spec()
        return self


class LlamaGrammar:
    """llama-cpp-python's LlamaGrammar: a grammar for Llama's create_completion(grammar=...).
    from_string takes llama.cpp's GBNF (or llguidance's Lark), from_json_schema a schema's JSON
    text; both raise ValueError naming what is wrong."""

    def __init__(self, params: StructuredOutputsParams):
        self.params = params
        text = params.grammar if params.grammar is not None else params.json
        self._grammar = text if isinstance(text, str) else json.dumps(text)
        params.check()

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        return cls(StructuredOutputsParams(grammar=grammar))

    @classmethod
    def from_file(cls, file: Union[str, os.PathLike], verbose: bool = True) -> "LlamaGrammar":
        with open(file, encoding="utf-8") as f:
            text = f.read()
        if not text.strip():
            raise ValueError(f"LlamaGrammar.from_file: {file} is empty")
        return cls.from_string(text, verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> "LlamaGrammar":
        return cls(StructuredOutputsParams(json=json_schema))

    def grammar_spec(self) -> Tuple[str, str]:
        return self.params.grammar_spec()


def response_format_params(response_format) -> Optional[StructuredOutputsParams]:
    """OpenAI's and llama-cpp-python's response_format: {"type": "text"} (None), {"type":
    "json_object"} (any object; llama-cpp-python's "schema" key constrains it to that schema) or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}. ValueError naming what is
    wrong."""
    if response_format is None:
        return None
    if hasattr(response_format, "model_dump"):
        response_format = response_format.model_dump(exclude_none=True)
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise ValueError(f"response_format must be an object with a 'type', got {response_format!r}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return (StructuredOutputsParams(json_object=True) if schema is None
                else StructuredOutputsParams(json=schema)).check()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec and "schema_" not in spec:
            raise ValueError("response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")
        schema = spec.get("schema", spec.get("schema_"))
        return StructuredOutputsParams(json=schema).check()
    raise ValueError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
