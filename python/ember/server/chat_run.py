"""One chat generation for the APIs that are not OpenAI's chat completions (/v1/responses,
Anthropic's /v1/messages): OpenAI-style messages and tools in, the reply's visible text as it
grows, then its content, tool calls, finish reason and token counts. The server's checks (model,
context room, --max-queue, draining) apply as to every request. A reasoning model's reply is split
as the chat completions split it (ember.chat.reasoning): its thinking is reasoning, the rest content."""
from __future__ import annotations

import uuid
from typing import AsyncIterator, List, Optional, Tuple

from fastapi import Request

from ..chat import ChatTemplateError, ToolCallParser
from ..sampling_params import SamplingParams
from .constraints import ChatConstraint, build_chat
from .merge import newest_outputs
from .openai_schema import APIError


def sampling(max_tokens: Optional[int], temperature, top_p, top_k=None, stop=None) -> SamplingParams:
    """SamplingParams from the request's fields (None: OpenAI's defaults); 400 naming a bad one."""
    kw = dict(max_tokens=max_tokens, temperature=1.0 if temperature is None else temperature,
              top_p=1.0 if top_p is None else top_p, top_k=-1 if top_k is None else top_k, stop=stop)
    try:
        return SamplingParams(**kw)
    except (TypeError, ValueError) as e:
        param = next((k for k in kw if f" {k} " in f" {e} ".replace(":", " ")), None)
        raise APIError(400, str(e).replace("SamplingParams: ", ""), param=param, code="invalid_value") from None


class ChatRun:
    """messages / tools in OpenAI's chat form; use_tools: the reply is parsed for tool calls;
    required: it must call one (tool_name: that one), constrained to the tools' schemas; parallel:
    several calls may come (never for a named tool); budget: tokens it may think (None: the server's
    --reasoning-budget)."""

    def __init__(self, srv, messages: List[dict], tools: Optional[List[dict]], params: SamplingParams,
                 use_tools: bool, model: Optional[str], required: bool = False, tool_name: Optional[str] = None,
                 budget: Optional[int] = None, parallel: bool = True):
        self.srv = srv
        self.messages, self.tools, self.params = messages, tools, params
        self.parser: Optional[ToolCallParser] = srv.tool_parser if use_tools and tools else None
        self.model = model
        self.thinking = srv.reasoning   # how replies spell their thinking
        if self.thinking.keeps_special:
            params.skip_special_tokens = False   # the thinking's markers are special tokens
        if tool_name is not None:
            tools = [t for t in tools if t["function"]["name"] == tool_name]
        budget = srv.settings.reasoning_budget if budget is None else budget
        self.constraint = ChatConstraint(tools=tools if self.parser else None, required=required,
                                         parallel=parallel and tool_name is None,
                                         budget=budget if budget >= 0 else None)
        self.prompt = ""
        self.text = ""
        self.content: Optional[str] = None
        self.reasoning = ""
        self.calls: List[dict] = []
        self.finish_reason: Optional[str] = None
        self.stop_string: Optional[str] = None
        self.n_prompt = self.n_completion = self.n_reasoning = 0

    def render(self) -> List[int]:
        """The prompt's token ids: the messages rendered by the chat template (400 where it refuses them)."""
        srv = self.srv
        try:
            text = srv.template.render(self.messages, tools=self.tools)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from None
        self.prompt = text
        self.params.structured_outputs = build_chat(self.constraint, self.thinking, text, srv.tool_parser.style,
                                                    srv.spell)
        return list(srv.tok.encode(text.encode("utf-8"), srv.template.add_bos(text), True))

    async def start(self) -> None:
        """Checks and renders; raises APIError before anything is sent."""
        srv = self.srv
        self.engine = srv.ready()
        srv.check_open()
        srv.check_model(self.model)
        self.ids = await srv.cpu(self.render)
        self.n_prompt = len(self.ids)
        wanted = self.n_prompt + (self.params.max_tokens or 1)
        if wanted > srv.n_ctx:
            raise APIError(400, f"This model's maximum context length is {srv.n_ctx} tokens. However, you requested "
                                f"{wanted} tokens ({self.n_prompt} in the messages, {wanted - self.n_prompt} for the "
                                f"completion).", param="max_tokens", code="context_length_exceeded")
        self.admission = srv.check_queue(1, 1)

    async def deltas(self, request: Request) -> AsyncIterator[Tuple[bool, str]]:
        """The reply's text as it may be shown (never the start of a tool call), piece by piece, as
        (is_reasoning, text): reasoning pieces come only from reasoning models. Afterwards content,
        reasoning, calls, finish_reason and the counts are set. A client that leaves ends it, and
        the request in the engine."""
        request_id = f"chat-{uuid.uuid4().hex}"
        outputs = self.srv._tracked(newest_outputs([self.engine.generate(self.ids, self.params, request_id)]),
                                    [request_id], self.admission)
        splitter = self.thinking.splitter(self.prompt)
        body = ""     # the content so far (the reply less its thinking)
        fed = shown = 0
        last = None
        try:
            async for _, out in outputs:
                last = out
                text = out.outputs[0].text
                if splitter is None:
                    body = text
                else:
                    content, reasoning = splitter.feed(text[fed:])
                    fed = len(text)
                    body += content
                    if reasoning:
                        self.reasoning += reasoning
                        yield True, reasoning
                visible = self.parser.held_from(body) if self.parser else len(body)
                if visible > shown:
                    yield False, body[shown:visible]
                    shown = visible
                if out.finished:
                    break
        finally:
            await outputs.aclose()
        if last is None:
            raise APIError(500, "the engine returned nothing for this request", type="server_error")
        seq = last.outputs[0]
        if seq.finish_reason == "error":
            raise APIError(500, "generation failed", type="server_error")
        if splitter is not None:
            # A reply cut off (max_tokens) inside a channel ends with what that channel has.
            content, reasoning = splitter.finish()
            body += content
            if reasoning:
                self.reasoning += reasoning
                yield True, reasoning
        self.text = seq.text
        self.n_completion = len(seq.token_ids)
        self.n_reasoning = self.thinking.thinking_tokens(self.prompt, seq.token_ids, self.srv.tok)
        self.finish_reason = seq.finish_reason
        self.stop_string = seq.stop_reason if isinstance(seq.stop_reason, str) else None
        content, calls = self.parser.parse(body) if self.parser else (body, [])
        self.content, self.calls = content, calls
        if calls:
            self.finish_reason = "tool_calls"
        rest = (content or "")[shown:] if calls else body[shown:]
        if rest:
            yield False, rest

    async def run(self, request: Request) -> None:
        """The whole reply (deltas, drained)."""
        async for _ in self.deltas(request):
            pass
