"""OpenAI's Responses API, /v1/responses: input as a string or a list of message, function_call
and function_call_output items, instructions, function tools, and the streamed events
(response.created ... response.completed). Nothing is stored: previous_response_id is refused. A
harmony reply's analysis channel (gpt-oss) comes as a reasoning item (reasoning_text content)
before the message, as gpt-oss's reference Responses server gives it."""
from __future__ import annotations

import json
import time
import uuid
from typing import List, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from .chat_run import ChatRun, sampling
from .openai_schema import APIError, bad_param

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param(param, f"'{param}' must be a string or a list of text parts")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise bad_param(f"{param}[{i}]", f"only text parts are supported, got {kind!r}")
        parts.append(part["text"])
    return "".join(parts)


def chat_messages(body: dict) -> List[dict]:
    """instructions and input as OpenAI chat messages."""
    out = []
    if body.get("instructions") is not None:
        out.append({"role": "system", "content": _text(body["instructions"], "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_param("input", "'input' must be a string or a non-empty list of items")
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in _ROLES:
            out.append({"role": _ROLES[item["role"]], "content": _text(item.get("content", ""), f"input[{i}].content")})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", "{}"))}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)   # parallel calls are one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue
        else:
            raise bad_param(f"input[{i}]", f"input item of type {kind!r} is not supported")
    return out


def _tools(body: dict) -> Optional[List[dict]]:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise bad_param("tools", "'tools' must be a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise bad_param(f"tools[{i}]", "only function tools ({'type': 'function', 'name': ...}) are supported")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t.get("parameters") or {"type": "object"}}})
    return out


def _run(srv, body: dict) -> ChatRun:
    if body.get("previous_response_id") is not None:
        raise bad_param("previous_response_id", "ember stores no responses: send the whole conversation as 'input'")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad_param("max_output_tokens", "'max_output_tokens' must be a whole number >= 1")
    temperature = body.get("temperature")
    if temperature is not None and not (isinstance(temperature, (int, float)) and 0 <= temperature <= 2):
        raise bad_param("temperature", "'temperature' must be a number in [0, 2]")
    choice = body.get("tool_choice", "auto")
    tools = _tools(body)
    name = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if name is not None:
        if name not in [t["function"]["name"] for t in tools or []]:
            raise bad_param("tool_choice", f"tool_choice names the function {name!r}, which is not among 'tools'")
    elif choice not in ("auto", "none", "required"):
        raise bad_param("tool_choice", "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', "
                                       "'name': ...}")
    elif choice == "required" and not tools:
        raise bad_param("tool_choice", "tool_choice 'required' needs 'tools'")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_param("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    params = sampling(max_tokens, temperature, body.get("top_p"))
    return ChatRun(srv, chat_messages(body), tools, params, choice != "none", body.get("model"),
                   required=name is not None or choice == "required", tool_name=name, parallel=parallel)


class _Response:
    """One response object's ids and its body at each stage."""

    def __init__(self, body: dict, model: str):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.body, self.model = body, model

    @staticmethod
    def item(reasoning: bool, item_id: str, text: str, status: str) -> dict:
        """A reasoning item or the assistant's message, holding text."""
        if reasoning:
            return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
                    "content": [{"type": "reasoning_text", "text": text}] if status == "completed" or text else []}
        return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" or text
                else []}

    def call_items(self, run: ChatRun) -> List[dict]:
        return [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": c["id"],
                 "name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": "completed"}
                for c in run.calls]

    def obj(self, status: str, output: list, run: Optional[ChatRun] = None) -> dict:
        incomplete = run is not None and run.finish_reason == "length"
        usage = None
        if run is not None and status != "in_progress":
            usage = {"input_tokens": run.n_prompt, "output_tokens": run.n_completion,
                     "total_tokens": run.n_prompt + run.n_completion, "input_tokens_details": {"cached_tokens": 0},
                     "output_tokens_details": {"reasoning_tokens": run.n_reasoning}}
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": "incomplete" if incomplete and status == "completed" else status,
                "model": self.model, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": self.body.get("instructions"), "tools": self.body.get("tools") or [],
                "tool_choice": self.body.get("tool_choice", "auto"),
                "parallel_tool_calls": self.body.get("parallel_tool_calls", True),
                "temperature": self.body.get("temperature"), "top_p": self.body.get("top_p"),
                "max_output_tokens": self.body.get("max_output_tokens"), "metadata": self.body.get("metadata") or {},
                "text": {"format": {"type": "text"}}, "usage": usage}

    def output(self, run: ChatRun) -> list:
        items = [self.item(True, f"rs_{uuid.uuid4().hex}", run.reasoning, "completed")] if run.reasoning else []
        if run.content:
            items.append(self.item(False, f"msg_{uuid.uuid4().hex}", run.content, "completed"))
        return items + self.call_items(run)


async def _events(run: ChatRun, request: Request, resp: _Response):
    seq = iter(range(1 << 62))

    def event(kind: str, **data) -> str:
        return f"event: {kind}\ndata: {json.dumps(dict(type=kind, sequence_number=next(seq), **data))}\n\n"
    yield event("response.created", response=resp.obj("in_progress", []))
    yield event("response.in_progress", response=resp.obj("in_progress", []))
    output: List[dict] = []
    kind, item_id, text = None, "", ""   # the item being streamed: reasoning (True) or message (False)

    def close():
        ids = dict(item_id=item_id, output_index=len(output), content_index=0)
        if kind:
            yield event("response.reasoning_text.done", text=text, **ids)
            yield event("response.content_part.done", part={"type": "reasoning_text", "text": text}, **ids)
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            yield event("response.output_text.done", text=text, **ids)
            yield event("response.content_part.done", part=part, **ids)
        done = resp.item(kind, item_id, text, "completed")
        yield event("response.output_item.done", output_index=len(output), item=done)
        output.append(done)

    try:
        async for reasoning, piece in run.deltas(request):
            if reasoning is not kind:   # a new item: reasoning and the message alternate as the reply does
                if kind is not None:
                    for e in close():
                        yield e
                kind, item_id, text = reasoning, f"{'rs' if reasoning else 'msg'}_{uuid.uuid4().hex}", ""
                yield event("response.output_item.added", output_index=len(output),
                            item=resp.item(kind, item_id, "", "in_progress"))
                part = {"type": "reasoning_text", "text": ""} if kind else \
                    {"type": "output_text", "text": "", "annotations": []}
                yield event("response.content_part.added", item_id=item_id, output_index=len(output),
                            content_index=0, part=part)
            text += piece
            yield event("response.reasoning_text.delta" if kind else "response.output_text.delta", delta=piece,
                        item_id=item_id, output_index=len(output), content_index=0)
    except APIError as e:
        yield event("error", code=e.code, message=e.message, param=e.param)
        return
    if kind is not None:
        for e in close():
            yield e
    index = len(output)
    for item in resp.call_items(run):
        yield event("response.output_item.added", output_index=index, item=dict(item, arguments="",
                                                                                 status="in_progress"))
        yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                    delta=item["arguments"])
        yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                    arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
        output.append(item)
        index += 1
    final = resp.obj("completed", output, run)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


def register(app, srv) -> None:
    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await srv.body(request)
        run = _run(srv, body)
        await run.start()
        resp = _Response(body, body.get("model") or srv.model_id)
        if body.get("stream"):
            return StreamingResponse(_events(run, request, resp), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        t0 = time.perf_counter()
        await run.run(request)
        request.state.log = f"{resp.id} {run.finish_reason} prompt={run.n_prompt} completion={run.n_completion} " \
                            f"total={(time.perf_counter() - t0) * 1e3:.0f}ms"
        return resp.obj("completed", resp.output(run), run)
