"""OpenAI's response objects built from the engine's RequestOutputs: `text_completion` and
`chat.completion` bodies, their streamed chunks (deltas computed from the cumulative outputs,
the same id on every chunk, the role in the first chat delta, one choice per chunk), usage and
logprobs in each endpoint's format; the embeddings' list object.

A chat request with tools has each reply parsed for tool calls (ember.chat.tool_calls): a reply that
calls them has `tool_calls`, its content is the text before the first call, and it finishes with
"tool_calls"; streamed, the text that may be a call is held back until the reply ends, then the
calls come in one delta. A reasoning model's reply is split first (ember.chat.reasoning: `<think>`
tags, gpt-oss's harmony channels): its thinking is reasoning_content, the rest the content, which is
then read for tool calls (streamed as deltas of each).

A completion request may hold several prompts, each one RequestOutput with n sequences: choice
`index` runs over prompts x n (prompt p's sequence j is choice p * n + j), as OpenAI's does."""
from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Dict, List, Optional, Tuple

from ..chat import ToolCallParser
from ..chat.reasoning import ReasoningParser
from ..detokenize import piece_text
from ..outputs import RequestOutput
from .openai_schema import GenerationRequest


def embedding_list(vectors, model: str, n_tokens: int, encoding_format: str) -> dict:
    """OpenAI's embeddings response: vectors (float32 arrays) in input order; base64 carries each
    vector's little-endian float32 bytes, as OpenAI's does."""
    def encode(v):
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if encoding_format == "base64" \
            else v.tolist()
    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
            "model": model, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def sse(obj) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def _top(entry: Dict[int, float], k: int) -> list:
    """The k most likely (token id, logprob) of an entry: it holds the sampled token and the top k."""
    return sorted(entry.items(), key=lambda kv: -kv[1])[:k]


class ResponseBuilder:
    """One request's responses. chat: chat.completion objects, else text_completion. prompt_texts:
    the text of each prompt, which echo repeats (chat has one). tool_parser: the chat template's
    tool call syntax where replies are parsed for calls, else None. reasoning: how chat replies spell
    their thinking (None: they are all content)."""

    def __init__(self, req: GenerationRequest, model: str, tokenizer, prompt_texts: List[str], chat: bool,
                 tool_parser: Optional[ToolCallParser] = None, reasoning: Optional[ReasoningParser] = None):
        self.req = req
        self.chat = chat
        self._tools = tool_parser if chat else None
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self._tok = tokenizer
        self._prompt_texts = prompt_texts
        self._n = req.params.n
        choices = len(prompt_texts) * self._n
        self._sent_text = [0] * choices      # chars of each choice's text (chat: content) already streamed
        self._sent_tokens = [0] * choices    # tokens whose logprobs were already streamed
        # text_offset of each choice's next token
        self._offset = [len(prompt_texts[i // self._n]) if req.echo else 0 for i in range(choices)]
        self._started = [False] * choices
        self._finished = [False] * choices
        self._reasoning = reasoning if chat and reasoning is not None and reasoning.active else None
        # A harmony reply's calls are its commentary channel's, which are not parsed.
        if self._reasoning is not None and self._reasoning.name == "gpt_oss":
            self._tools = None
        self._splitters = [self._reasoning.splitter(self._prompt_text(i)) for i in range(choices)] \
            if self._reasoning is not None else None
        self._fed = [0] * choices            # chars of each choice's text given to its splitter
        self._content = [""] * choices       # each chat choice's content so far

    def _prompt_text(self, index: int) -> str:
        return self._prompt_texts[index // self._n]

    def _piece(self, token: int) -> bytes:
        return bytes(self._tok.token_to_piece(token, False))

    def _text(self, token: int) -> str:
        # As in Llama's logprobs.
        return piece_text(self._tok, token)

    # ---- logprobs ------------------------------------------------------------------------
    def _chat_logprobs(self, out, start: int) -> dict:
        k = self.req.logprobs

        def item(t, lp):
            return {"token": self._text(t), "logprob": lp, "bytes": list(self._piece(t))}
        content = []
        for t, entry in zip(out.token_ids[start:], out.logprobs[start:]):
            content.append(dict(item(t, entry[t]), top_logprobs=[item(c, lp) for c, lp in _top(entry, k)]))
        return {"content": content, "refusal": None}

    def _completion_logprobs(self, index: int, out, start: int, prompt: Optional[RequestOutput]) -> dict:
        """The legacy format: tokens, token_logprobs, top_logprobs ({text: logprob}, the sampled
        token included) and text_offset; the echoed prompt first when prompt is given (its first
        token has no logprob unless it follows a BOS, which is left out)."""
        lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

        def add(text, logprob, top):
            lp["tokens"].append(text)
            lp["token_logprobs"].append(logprob)
            lp["top_logprobs"].append(top)
            lp["text_offset"].append(self._offset[index])
            self._offset[index] += len(text)

        if prompt is not None:
            self._offset[index] = 0
            ids, plps = prompt.prompt_token_ids, prompt.prompt_logprobs or [None] * len(prompt.prompt_token_ids)
            for i in range(1 if ids[0] == self._tok.bos else 0, len(ids)):
                logprob = plps[i][ids[i]] if i > 0 and plps[i] else None
                text = self._text(ids[i])
                add(text, logprob, None if logprob is None else {text: logprob})
            self._offset[index] = len(self._prompt_text(index))
        for t, entry in zip(out.token_ids[start:], out.logprobs[start:]):
            top = {self._text(c): v for c, v in _top(entry, self.req.logprobs)}
            text = self._text(t)
            top.setdefault(text, entry[t])
            add(text, entry[t], top)
        return lp

    def _logprobs(self, index: int, out, start: int, prompt: Optional[RequestOutput] = None):
        if self.req.logprobs is None:
            return None
        return self._chat_logprobs(out, start) if self.chat else self._completion_logprobs(index, out, start, prompt)

    # ---- tool calls ----------------------------------------------------------------------
    def _allowed(self, calls: list) -> list:
        return calls if self.req.parallel_tool_calls else calls[:1]

    def _reply(self, i: int, o) -> Tuple[Optional[str], list, str]:
        """A finished chat reply's content, tool calls and reasoning."""
        text, reasoning = self._reasoning.split(o.text, self._prompt_text(i)) if self._reasoning else (o.text, "")
        if self._tools is None:
            return text, [], reasoning
        content, calls = self._tools.parse(text)
        return content, self._allowed(calls), reasoning

    @staticmethod
    def _finish_reason(o, calls: list) -> Optional[str]:
        return "tool_calls" if calls and o.finish_reason == "stop" else o.finish_reason

    def _advance(self, i: int, o) -> Tuple[str, int, list]:
        """Takes choice i's new text: its new reasoning, how far its content may stream now, and its
        calls once it has finished."""
        new, done = o.text[self._fed[i]:], o.finish_reason is not None
        self._fed[i] = len(o.text)
        reasoning = ""
        if self._splitters is not None:
            splitter = self._splitters[i]
            new, reasoning = splitter.feed(new)
            if done and not self._finished[i]:
                c, r = splitter.finish()
                new, reasoning = new + c, reasoning + r
        self._content[i] += new
        content = self._content[i]
        if self._tools is None:
            return reasoning, len(content), []
        if not done:
            return reasoning, max(self._sent_text[i], self._tools.held_from(content)), []
        start, calls = self._tools.split(content)
        return reasoning, max(self._sent_text[i], start), self._allowed(calls)

    # ---- whole responses -----------------------------------------------------------------
    def usage(self, finals: List[RequestOutput]) -> dict:
        """Exact counts, summed over the prompts: each prompt's tokens once, every choice's
        generated tokens."""
        n_prompt = sum(len(f.prompt_token_ids) for f in finals)
        n_completion = sum(len(o.token_ids) for f in finals for o in f.outputs)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion,
                 "prompt_tokens_details": {"cached_tokens": sum(f.num_cached_tokens for f in finals)}}
        if self._reasoning is not None and self._tok is not None:
            thinking = sum(self._reasoning.thinking_tokens(self._prompt_text(p * self._n), o.token_ids, self._tok)
                           for p, f in enumerate(finals) for o in f.outputs)
            usage["completion_tokens_details"] = {"reasoning_tokens": thinking}
        return usage

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, finals: List[RequestOutput]) -> dict:
        """The non-streamed body; finals: each prompt's last output, in prompt order."""
        choices = []
        for p, final in enumerate(finals):
            for o in final.outputs:
                i = p * self._n + o.index
                lp = self._logprobs(i, o, 0, final if self.req.echo else None)
                if self.chat:
                    content, calls, reasoning = self._reply(i, o)
                    message = {"role": "assistant", "content": content}
                    if reasoning:
                        message["reasoning_content"] = reasoning
                    if calls:
                        message["tool_calls"] = calls
                    choices.append({"index": i, "message": message, "logprobs": lp,
                                    "finish_reason": self._finish_reason(o, calls), "stop_reason": o.stop_reason})
                else:
                    text = self._prompt_text(i) + o.text if self.req.echo else o.text
                    choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": o.finish_reason,
                                    "stop_reason": o.stop_reason})
        return dict(self._head("chat.completion" if self.chat else "text_completion"), choices=choices,
                    usage=self.usage(finals))

    # ---- streaming -----------------------------------------------------------------------
    def _chunk(self, choice: Optional[dict], usage: Optional[dict] = None) -> dict:
        chunk = dict(self._head("chat.completion.chunk" if self.chat else "text_completion"),
                     choices=[choice] if choice is not None else [])
        if self.req.include_usage:
            chunk["usage"] = usage
        return chunk

    def opening_chunks(self) -> List[dict]:
        """Sent before any token: the role of each chat choice."""
        if not self.chat:
            return []
        return [self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}) for i in range(len(self._sent_text))]

    def chunks(self, prompt: int, out: RequestOutput) -> List[dict]:
        """The chunks that bring a client from prompt's previous output to out: new text (with its
        tokens' logprobs), then a chunk with the finish_reason once a choice ends."""
        chunks = []
        for o in out.outputs:
            i = prompt * self._n + o.index
            if self.chat:
                reasoning, end, calls = self._advance(i, o)
                text = self._content[i][self._sent_text[i]:end]
                delta = {"content": text, "reasoning_content": reasoning} if reasoning else {"content": text}
            else:
                reasoning, end, calls = "", len(o.text), []
                text = o.text[self._sent_text[i]:end]
            first = not self._started[i]
            echo = first and self.req.echo
            new_tokens = len(o.token_ids) > self._sent_tokens[i]
            if text or reasoning or echo or (new_tokens and self.req.logprobs is not None):
                lp = self._logprobs(i, o, self._sent_tokens[i], out if echo else None)
                if self.chat:
                    choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}
                else:
                    choice = {"index": i, "text": (self._prompt_text(i) if echo else "") + text, "logprobs": lp,
                              "finish_reason": None}
                chunks.append(self._chunk(choice))
                self._started[i] = True
                self._sent_text[i] = end
                self._sent_tokens[i] = len(o.token_ids)
            if o.finish_reason is not None and not self._finished[i]:
                self._finished[i] = True
                if calls:
                    delta = {"tool_calls": [dict(c, index=k) for k, c in enumerate(calls)]}
                    chunks.append(self._chunk({"index": i, "delta": delta, "logprobs": None, "finish_reason": None}))
                if self.chat:
                    choice = {"index": i, "delta": {}, "logprobs": None, "finish_reason": self._finish_reason(o, calls)}
                else:
                    choice = {"index": i, "text": "", "logprobs": None, "finish_reason": o.finish_reason}
                choice["stop_reason"] = o.stop_reason
                chunks.append(self._chunk(choice))
        return chunks

    def usage_chunk(self, finals: List[RequestOutput]) -> dict:
        """stream_options.include_usage's last chunk: no choices, the usage."""
        return self._chunk(None, self.usage(finals))
