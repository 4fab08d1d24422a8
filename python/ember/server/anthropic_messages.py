"""Anthropic's Messages API, /v1/messages (what Claude Code and the anthropic SDK speak): system
prompt, text and tool_use / tool_result blocks, tools, stop sequences, streaming events, and
/v1/messages/count_tokens. Requests become OpenAI-style chat messages for the model's template;
errors come in Anthropic's error body. A harmony reply's analysis channel (gpt-oss) comes as a
thinking block before the text unless the request sets thinking {"type": "disabled"}."""
from __future__ import annotations

import json
import time
import uuid
from typing import List, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from .chat_run import ChatRun, sampling
from .openai_schema import APIError

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def _bad(message: str) -> APIError:
    return APIError(400, message, code="invalid_value")


def error_response(e: APIError) -> JSONResponse:
    kind = _ERROR_TYPES.get(e.status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": e.message}}, status_code=e.status,
                        headers=e.headers)


def _text_of(content, where: str) -> str:
    """A block list's (or a string's) text; 400 for blocks ember cannot take (images, documents)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of content blocks")
    parts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise _bad(f"{where}: only text blocks are supported here, got {kind!r}")
        parts.append(block["text"])
    return "".join(parts)


def chat_messages(body: dict) -> List[dict]:
    """The request's system prompt and messages as OpenAI chat messages: tool_use blocks become an
    assistant's tool_calls, tool_result blocks tool messages."""
    out = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: must be a non-empty list")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise _bad(f"{where}: role must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"{where}: content must be a string or a list of content blocks")
        text, calls = [], []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text.append(_text_of([block], f"{where}.content[{j}]"))
            elif kind == "tool_use" and m["role"] == "assistant":
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": str(block.get("name", "")),
                                           "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
            elif kind == "tool_result" and m["role"] == "user":
                result = block.get("content", "")
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                            "content": _text_of(result, f"{where}.content[{j}].content")})
            elif kind in ("thinking", "redacted_thinking"):
                continue   # an earlier turn's reasoning: not shown to the model again
            else:
                raise _bad(f"{where}.content[{j}]: block type {kind!r} is not supported here")
        if text or calls:
            msg = {"role": m["role"], "content": "".join(text) if text or not calls else None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(body: dict) -> Optional[List[dict]]:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools: must be a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _bad(f"tools[{i}]: a tool needs a 'name'")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t.get("input_schema") or {"type": "object"}}})
    return out


def _run(srv, body: dict) -> ChatRun:
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad("max_tokens: required, a whole number >= 1")
    temperature = body.get("temperature")
    if temperature is not None and not (isinstance(temperature, (int, float)) and 0 <= temperature <= 1):
        raise _bad("temperature: must be a number in [0, 1]")
    stop = body.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise _bad("stop_sequences: must be a list of non-empty strings")
    choice = body.get("tool_choice") or {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "none", "any", "tool"):
        raise _bad("tool_choice: type must be auto, any, tool or none")
    tools = _tools(body)
    name = choice.get("name") if choice["type"] == "tool" else None
    if choice["type"] in ("any", "tool") and not tools:
        raise _bad(f"tool_choice {choice['type']!r} needs tools")
    if choice["type"] == "tool" and name not in [t["function"]["name"] for t in tools]:
        raise _bad(f"tool_choice names the tool {name!r}, which is not among tools")
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled")):
        raise _bad("thinking: must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}")
    budget = (thinking or {}).get("budget_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise _bad("thinking.budget_tokens: must be a whole number >= 0")
    params = sampling(max_tokens, temperature, body.get("top_p"), body.get("top_k"), stop)
    return ChatRun(srv, chat_messages(body), tools, params, choice["type"] != "none", body.get("model"),
                   required=choice["type"] in ("any", "tool"), tool_name=name, budget=budget,
                   parallel=not choice.get("disable_parallel_tool_use", False))


def _thinking(body: dict) -> bool:
    return (body.get("thinking") or {}).get("type") != "disabled"


def _content(run: ChatRun, thinking: bool) -> List[dict]:
    # Anthropic's signature verifies its own thinking; ember's has none to give.
    blocks = [{"type": "thinking", "thinking": run.reasoning, "signature": ""}] if thinking and run.reasoning else []
    if run.content:
        blocks.append({"type": "text", "text": run.content})
    for call in run.calls:
        blocks.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call["function"]["name"],
                       "input": json.loads(call["function"]["arguments"] or "{}")})
    return blocks


def _stop(run: ChatRun):
    if run.stop_string is not None:
        return "stop_sequence", run.stop_string
    return _STOP_REASONS.get(run.finish_reason, "end_turn"), None


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(dict(data, type=kind), ensure_ascii=False)}\n\n"


async def _events(run: ChatRun, request: Request, message_id: str, model: str, thinking: bool):
    start = {"id": message_id, "type": "message", "role": "assistant", "content": [], "model": model,
             "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": run.n_prompt, "output_tokens": 0}}
    yield _event("message_start", {"message": start})
    index, kind = 0, None   # the open block: thinking (True) or text (False)
    try:
        async for reasoning, piece in run.deltas(request):
            if reasoning and not thinking:
                continue
            if reasoning is not kind:
                if kind is not None:
                    yield _event("content_block_stop", {"index": index})
                    index += 1
                kind = reasoning
                block = {"type": "thinking", "thinking": "", "signature": ""} if kind else {"type": "text", "text": ""}
                yield _event("content_block_start", {"index": index, "content_block": block})
            delta = {"type": "thinking_delta", "thinking": piece} if kind else {"type": "text_delta", "text": piece}
            yield _event("content_block_delta", {"index": index, "delta": delta})
    except APIError as e:
        yield _event("error", {"error": {"type": "api_error", "message": e.message}})
        return
    if kind is not None:
        yield _event("content_block_stop", {"index": index})
        index += 1
    for block in _content(run, False):
        if block["type"] != "tool_use":
            continue
        yield _event("content_block_start", {"index": index, "content_block": dict(block, input={})})
        yield _event("content_block_delta", {"index": index, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
        yield _event("content_block_stop", {"index": index})
        index += 1
    reason, sequence = _stop(run)
    yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": {"output_tokens": run.n_completion}})
    yield _event("message_stop", {})


def register(app, srv) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request):
        try:
            body = await srv.body(request)
            run = _run(srv, body)
            await run.start()
        except APIError as e:
            return error_response(e)
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        model = body.get("model") or srv.model_id
        t0 = time.perf_counter()
        if body.get("stream"):
            return StreamingResponse(_events(run, request, message_id, model, _thinking(body)),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            await run.run(request)
        except APIError as e:
            return error_response(e)
        reason, sequence = _stop(run)
        request.state.log = f"{message_id} {reason} prompt={run.n_prompt} completion={run.n_completion} " \
                            f"total={(time.perf_counter() - t0) * 1e3:.0f}ms"
        return {"id": message_id, "type": "message", "role": "assistant", "model": model,
                "content": _content(run, _thinking(body)), "stop_reason": reason, "stop_sequence": sequence,
                "usage": {"input_tokens": run.n_prompt, "output_tokens": run.n_completion}}

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            body = dict(await srv.body(request), max_tokens=1)
            run = _run(srv, body)
            srv.ready()
            ids = await srv.cpu(run.render)
        except APIError as e:
            return error_response(e)
        return {"input_tokens": len(ids)}
