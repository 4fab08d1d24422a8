"""The OpenAI request bodies the server takes, checked field by field, and OpenAI's error body.
parse_completion / parse_chat turn a JSON body into a GenerationRequest (SamplingParams and the
rest), parse_embeddings into an EmbeddingRequest, or raise APIError, which the app answers as
`{"error": {"message", "type", "param", "code"}}`.
Unknown fields are ignored, as OpenAI clients send fields a server may not know; every string of a
body must be valid Unicode, and every number a field takes must fit the engine's type of it
(int32, uint64 seeds, float32), so a request is refused here, before anything is queued."""
from __future__ import annotations

import json
import math
import numbers
import struct
from dataclasses import dataclass, field
from typing import Any, List, Optional, Union

from ..sampling_params import SamplingParams

MAX_N = 128          # sequences of one request: n beyond this is a mistake or abuse
MAX_PROMPTS = 256    # prompts of one /v1/completions request (each runs n sequences)
MAX_TOP_LOGPROBS = 20   # OpenAI's bound
MAX_DEPTH = 64       # nesting of a body: tool schemas need a few levels, nothing needs dozens
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
# The template variables a request's chat_template_kwargs may not replace.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
REASONING_EFFORTS = ("minimal", "low", "medium", "high")   # OpenAI's reasoning_effort


class APIError(Exception):
    """An answer with OpenAI's error body; headers go out with it (Retry-After on 503)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_param(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


@dataclass
class GenerationRequest:
    """A checked /v1/completions or /v1/chat/completions body. logprobs: None, or how many top
    candidates each token reports (0: the sampled token's alone). prompts: completions' prompts,
    each a str or token ids (each gets n choices); messages / tools / template_kwargs: chat's;
    tool_choice: "auto" (replies are parsed for calls to the tools), "required" (the reply is calls:
    to tool_name alone where it is given) or "none"; parallel_tool_calls: False keeps a reply's first
    call only. thinking_budget: the request's thinking_token_budget (None: the server's);
    reasoning_format: llama-server's per-request reasoning parser (None: the server's); constraint:
    what the body asks the reply to be (ember.server.constraints), set by the route."""
    model: Optional[str]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    logprobs: Optional[int] = None
    echo: bool = False
    prompts: Optional[List[Union[str, List[int]]]] = None
    messages: Optional[list] = None
    tools: Optional[list] = None
    template_kwargs: dict = field(default_factory=dict)
    tool_choice: str = "none"
    tool_name: Optional[str] = None
    parallel_tool_calls: bool = True
    thinking_budget: Optional[int] = None
    reasoning_format: Optional[str] = None
    constraint: Any = None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def read_json(raw: bytes) -> dict:
    """The body as a JSON object of valid strings and finite numbers, nested at most MAX_DEPTH
    deep, or a 400 naming the field."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)",
                       code="invalid_json") from None
    except ValueError as e:   # bad syntax, bad UTF-8, NaN / Infinity, an integer of thousands of digits
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    _check_values(body)
    return body


def _path(trail) -> str:
    parts = []
    while trail is not None:
        key, trail = trail
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "body"


def _valid_text(s: str) -> bool:
    """False for a string holding a lone surrogate (JSON's "\\ud800"), which no UTF-8 can carry."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_values(body: dict) -> None:
    # Iterative: a body is at most MAX_DEPTH deep, but its width is anything up to the size limit.
    stack = [(body, None, 1)]
    while stack:
        value, trail, depth = stack.pop()
        if isinstance(value, dict):
            items = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            if isinstance(value, str) and not _valid_text(value):
                raise bad_param(_path(trail), f"'{_path(trail)}' holds a lone UTF-16 surrogate, which is not text")
            if isinstance(value, float) and not math.isfinite(value):
                raise bad_param(_path(trail), f"'{_path(trail)}' is out of range (it overflows a double)")
            continue
        if depth > MAX_DEPTH:
            raise bad_param(_path(trail), f"the request body is nested more than {MAX_DEPTH} levels deep")
        for key, item in items:
            if isinstance(key, str) and not _valid_text(key):
                raise bad_param(_path(trail), f"a key of '{_path(trail)}' holds a lone UTF-16 surrogate")
            if isinstance(item, (dict, list, str, float)):
                stack.append((item, (key, trail), depth + 1))


def float32(name: str, value) -> float:
    """value as the engine's float32 holds it, or a 400 when it overflows float32."""
    try:
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    except OverflowError:
        raise bad_param(name, f"'{name}' is {value!r}, outside the float32 range of the engine "
                              f"(|x| < 3.4e38)") from None


_KINDS = {
    "int": ("an integer", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)),
    "int64": ("an integer", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)),
    "number": ("a number", lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)),
    "bool": ("a boolean", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "list": ("an array", lambda v: isinstance(v, list)),
}


def get(body: dict, name: str, kind: str, default: Any = None, ok=None, rule: str = "") -> Any:
    """body[name] if it is of kind (null or absent: default) and ok(value) holds, else a 400
    naming the field and the rule. "int" is an int32 as the engine holds it, "int64" a 64-bit
    one; a "number" must fit float32, and ok sees it rounded so (1e-300 is 0 there)."""
    value = body.get(name)
    if value is None:
        return default
    what, is_kind = _KINDS[kind]
    if not is_kind(value):
        raise bad_param(name, f"'{name}' must be {what}, got {json.dumps(value)[:100]}")
    if kind in ("int", "int64"):
        lo, hi = INT32 if kind == "int" else INT64
        if not lo <= value <= hi:
            shown = str(value) if len(str(value)) <= 40 else f"an integer of {len(str(value))} digits"
            raise bad_param(name, f"'{name}' must be in [{lo}, {hi}] (the engine's "
                                  f"{'int32' if kind == 'int' else 'int64'}), got {shown}")
    checked = float32(name, value) if kind == "number" else value
    if ok is not None and not ok(checked):
        raise bad_param(name, f"'{name}' {rule}, got {value!r}")
    return value


def _is_token_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(_KINDS["int"][1](t) for t in v)


def _token_ids(tokens: list, name: str, n_vocab: int, param: str = "prompt") -> List[int]:
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_param(param, f"'{name}' token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
    return [int(t) for t in tokens]


def _prompts(body: dict, n_vocab: int) -> List[Union[str, List[int]]]:
    """OpenAI's four prompt forms (a string, token ids, an array of strings, an array of token id
    arrays; the last two may mix) as a list of prompts, each a str or token ids."""
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError(400, "'prompt' is required", param="prompt", code="missing_required_parameter")
    if isinstance(prompt, str):
        return [prompt]
    if _is_token_list(prompt):
        return [_token_ids(prompt, "prompt", n_vocab)]
    if not isinstance(prompt, list) or not prompt:
        raise bad_param("prompt", "'prompt' must be a string, an array of token ids, or a non-empty array of "
                                  "strings or token id arrays")
    if len(prompt) > MAX_PROMPTS:
        raise bad_param("prompt", f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request")
    prompts: List[Union[str, List[int]]] = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            prompts.append(item)
        elif _is_token_list(item):
            prompts.append(_token_ids(item, f"prompt[{i}]", n_vocab))
        else:
            raise bad_param("prompt", f"'prompt[{i}]' must be a string or a non-empty array of token ids, "
                                      f"got {json.dumps(item)[:100]}")
    return prompts


def _stop(body: dict) -> List[str]:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]   # empty strings ignored, as a lone "" is
    raise bad_param("stop", "'stop' must be a string or an array of strings")


def _logit_bias(body: dict, n_vocab: int) -> Optional[dict]:
    bias = get(body, "logit_bias", "object")
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise bad_param("logit_bias", f"'logit_bias' keys must be token ids, got {key!r}") from None
        if not 0 <= token < n_vocab:
            raise bad_param("logit_bias", f"'logit_bias' token id {token} is outside the vocabulary (0..{n_vocab - 1})")
        if not _KINDS["number"][1](value) or not -100 <= value <= 100:
            raise bad_param("logit_bias", f"'logit_bias' values must be numbers in [-100, 100], got {value!r}")
        out[token] = float(value)
    return out


def _stop_token_ids(body: dict, n_vocab: int) -> Optional[List[int]]:
    """vLLM's stop_token_ids: generation ends at any of them (not part of the text)."""
    ids = get(body, "stop_token_ids", "list")
    if ids is None:
        return None
    if not all(_KINDS["int"][1](t) for t in ids):
        raise bad_param("stop_token_ids",
                        f"'stop_token_ids' must be an array of token ids, got {json.dumps(ids)[:100]}")
    return _token_ids(ids, "stop_token_ids", n_vocab, "stop_token_ids")


def _seed(body: dict) -> Optional[int]:
    seed = get(body, "seed", "int64")
    if seed == -1:   # llama-server's "random"
        return None
    if seed is not None and not 0 <= seed < 1 << 63:
        raise bad_param("seed", f"'seed' must be in [0, 2**63) (or -1: random), got {seed}")
    return seed


def _sampling(body: dict, n_vocab: int, max_tokens: Optional[int], logprobs: Optional[int],
              prompt_logprobs: Optional[int]) -> SamplingParams:
    """The SamplingParams of the fields completions and chat share."""
    unit = (lambda v: 0 <= v <= 1, "must be in [0, 1]")
    penalty = (lambda v: -2 <= v <= 2, "must be in [-2, 2]")
    best_of = get(body, "best_of", "int")
    n = get(body, "n", "int", 1, lambda v: 1 <= v <= MAX_N, f"must be in [1, {MAX_N}]")
    if best_of is not None and best_of != n:
        raise bad_param("best_of", "'best_of' other than n is not supported")
    # llama-server's name, or vLLM's.
    repetition = "repeat_penalty" if body.get("repeat_penalty") is not None else "repetition_penalty"
    try:
        return SamplingParams(
            n=n,
            temperature=get(body, "temperature", "number", 1.0, lambda v: 0 <= v <= 2,
                            "must be in [0, 2] (OpenAI's range)"),
            top_p=get(body, "top_p", "number", 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]"),
            top_k=get(body, "top_k", "int", -1, lambda v: v >= -1, "must be >= -1 (-1 or 0: off)"),
            min_p=get(body, "min_p", "number", 0.0, *unit),
            presence_penalty=get(body, "presence_penalty", "number", 0.0, *penalty),
            frequency_penalty=get(body, "frequency_penalty", "number", 0.0, *penalty),
            repetition_penalty=get(body, repetition, "number", 1.0, lambda v: v > 0, "must be > 0"),
            max_tokens=max_tokens,
            min_tokens=get(body, "min_tokens", "int", 0, lambda v: v >= 0, "must be >= 0"),
            stop=_stop(body), stop_token_ids=_stop_token_ids(body, n_vocab), seed=_seed(body), logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            ignore_eos=get(body, "ignore_eos", "bool", False), logit_bias=_logit_bias(body, n_vocab),
            include_stop_str_in_output=get(body, "include_stop_str_in_output", "bool", False))
    # SamplingParams' own checks: the rules that tie fields together (min_tokens <= max_tokens, seed + n)
    except (TypeError, ValueError) as e:
        raise bad_param(None, str(e)) from None


def _max_tokens(body: dict, name: str, default: Optional[int]) -> Optional[int]:
    return get(body, name, "int", default, lambda v: v >= 1, "must be at least 1")


def _stream(body: dict) -> tuple:
    stream = get(body, "stream", "bool", False)
    options = get(body, "stream_options", "object", {})
    return stream, bool(stream and get(options, "include_usage", "bool", False))


def parse_completion(body: dict, n_vocab: int) -> GenerationRequest:
    """A /v1/completions body. max_tokens defaults to 16, as OpenAI's."""
    if body.get("suffix"):
        raise bad_param("suffix", "'suffix' (insertion) is not supported")
    logprobs = get(body, "logprobs", "int", None, lambda v: 0 <= v <= MAX_TOP_LOGPROBS,
                   f"must be in [0, {MAX_TOP_LOGPROBS}]")
    echo = get(body, "echo", "bool", False)
    stream, include_usage = _stream(body)
    prompts = _prompts(body, n_vocab)
    params = _sampling(body, n_vocab, _max_tokens(body, "max_tokens", 16), logprobs,
                       0 if echo and logprobs is not None else None)
    return GenerationRequest(model=get(body, "model", "str"), params=params, stream=stream,
                             include_usage=include_usage, logprobs=logprobs, echo=echo, prompts=prompts)


def _content_text(content, i: int) -> Optional[str]:
    """A message's content as the string templates expect: text parts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_param(f"messages[{i}].content", f"only text content parts are supported, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_param(f"messages[{i}].content", "a message's 'content' must be a string or an array of text parts")


def _messages(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty array of messages", param="messages",
                       code="missing_required_parameter" if messages is None else "invalid_value")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_param(f"messages[{i}]", "each message must be an object with a string 'role'")
        if m.get("content") is None and m["role"] != "assistant":   # (an assistant's tool calls may stand alone)
            raise bad_param(f"messages[{i}].content", f"a {m['role']!r} message needs a 'content'")
        out.append(dict(m, content=_content_text(m.get("content"), i)))
    return out


def _tools(body: dict) -> Optional[list]:
    tools = get(body, "tools", "list")
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise bad_param(f"tools[{i}]", "each tool must be {'type': 'function', 'function': {'name': ...}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_param(f"tools[{i}].function.name", "a tool's function needs a non-empty string 'name'")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise bad_param(f"tools[{i}].function.parameters", "a function's 'parameters' must be a JSON Schema object")
    return tools


def _tool_choice(body: dict, tools: Optional[list]) -> tuple:
    """(choice, the named tool or None): "none", "auto", or "required", which a named function
    ({"type": "function", "function": {"name": ...}}) is, for that tool alone."""
    choice = body.get("tool_choice")
    if choice is None:
        return ("auto" if tools else "none"), None
    name = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise bad_param("tool_choice", "a named tool_choice must be {'type': 'function', 'function': "
                                           f"{{'name': ...}}}}, got {json.dumps(choice)[:100]}")
        if name not in [t["function"]["name"] for t in tools or []]:
            raise bad_param("tool_choice", f"tool_choice names the function {name!r}, which is not among 'tools'")
        choice = "required"
    if choice not in ("none", "auto", "required"):
        shown = choice if isinstance(choice, str) else json.dumps(choice)
        raise bad_param("tool_choice", f"tool_choice {shown} is not one of 'none', 'auto', 'required' or a named "
                                       "function")
    if choice != "none" and not tools:
        raise bad_param("tool_choice", f"tool_choice {choice!r} needs 'tools'")
    return choice, name


def parse_chat(body: dict, n_vocab: int) -> GenerationRequest:
    """A /v1/chat/completions body. Without max_tokens / max_completion_tokens a reply may run to
    the end of the context, as OpenAI's."""
    want = get(body, "logprobs", "bool", False)
    top = get(body, "top_logprobs", "int", None, lambda v: 0 <= v <= MAX_TOP_LOGPROBS,
              f"must be in [0, {MAX_TOP_LOGPROBS}]")
    if top is not None and not want:
        raise bad_param("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    logprobs = (top or 0) if want else None
    max_tokens = _max_tokens(body, "max_completion_tokens", _max_tokens(body, "max_tokens", None))
    stream, include_usage = _stream(body)
    messages = _messages(body)
    params = _sampling(body, n_vocab, max_tokens, logprobs, None)
    tools = _tools(body)
    tool_choice, tool_name = _tool_choice(body, tools)
    budget = get(body, "thinking_token_budget", "int", None, lambda v: v >= -1, "must be >= 0 (-1: no limit)")
    return GenerationRequest(model=get(body, "model", "str"), params=params, stream=stream,
                             include_usage=include_usage, logprobs=logprobs, messages=messages, tools=tools,
                             template_kwargs=_template_kwargs(body), tool_choice=tool_choice, tool_name=tool_name,
                             parallel_tool_calls=get(body, "parallel_tool_calls", "bool", True),
                             thinking_budget=budget, reasoning_format=get(body, "reasoning_format", "str"))


def _template_kwargs(body: dict) -> dict:
    """vLLM's chat_template_kwargs: further template variables, never the ones a request sets.
    OpenAI's reasoning_effort reaches the template as reasoning_effort (gpt-oss's templates write it
    into the system message), as vLLM passes it."""
    kwargs = get(body, "chat_template_kwargs", "object", {})
    taken = sorted(RESERVED_TEMPLATE_VARIABLES & kwargs.keys())
    if taken:
        raise bad_param("chat_template_kwargs", f"'chat_template_kwargs' cannot set {', '.join(taken)}: the "
                                                f"request's own fields give them")
    effort = get(body, "reasoning_effort", "str", None, lambda v: v in REASONING_EFFORTS,
                 f"must be one of {', '.join(REASONING_EFFORTS)}")
    return {"reasoning_effort": effort, **kwargs} if effort is not None else kwargs


@dataclass
class EmbeddingRequest:
    """A checked /v1/embeddings body: each input as a str or token ids; encoding_format "float" or
    "base64" (each vector's float32 bytes, little-endian); dimensions: OpenAI's, each vector cut to
    its first dimensions values and normalized again (None: whole)."""
    model: Optional[str]
    inputs: List[Union[str, List[int]]]
    encoding_format: str = "float"
    dimensions: Optional[int] = None


def parse_embeddings(body: dict, n_vocab: int) -> EmbeddingRequest:
    """A /v1/embeddings body. input: a string, an array of strings, an array of token ids, or an
    array of those arrays (OpenAI's four forms); none of them may be empty."""
    raw = body.get("input")
    if raw is None:
        raise APIError(400, "'input' is required", param="input", code="missing_required_parameter")
    if isinstance(raw, str) or _is_token_list(raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise bad_param("input", "'input' must be a non-empty string, array of strings, array of token ids "
                                 "or array of token id arrays")
    inputs: List[Union[str, List[int]]] = []
    for i, item in enumerate(raw):
        if isinstance(item, str) and item:
            inputs.append(item)
        elif _is_token_list(item):
            bad = next((t for t in item if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise bad_param("input", f"'input[{i}]' token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
            inputs.append([int(t) for t in item])
        else:
            raise bad_param("input", f"'input[{i}]' must be a non-empty string or a non-empty array of token ids, "
                                     f"got {json.dumps(item)[:100]}")
    fmt = get(body, "encoding_format", "str", "float", lambda v: v in ("float", "base64"),
              "must be 'float' or 'base64'")
    dimensions = get(body, "dimensions", "int", None, lambda v: v >= 1, "must be >= 1")
    return EmbeddingRequest(model=get(body, "model", "str"), inputs=inputs, encoding_format=fmt, dimensions=dimensions)
