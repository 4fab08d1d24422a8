"""llama-cpp-python's chat results from Llama's completion results: `chat.completion` and
`chat.completion.chunk` dicts (the role in the first delta, the finish_reason in a last empty
one, logprobs in the chat format), for Llama.create_chat_completion. A reasoning model's reply
is split as ember-server splits it (reasoning.py): content is the answer, reasoning_content
(llama-server's field) the thinking."""
from __future__ import annotations

from typing import Iterator, Optional

from .reasoning import ReasoningParser


def _chat_logprobs(lp: Optional[dict]) -> Optional[dict]:
    """Completion logprobs (tokens, token_logprobs, top_logprobs {text: logprob}) in the chat
    format; Llama reports texts, not bytes, so `bytes` is None, as in llama-cpp-python."""
    if lp is None:
        return None
    content = [{"token": token, "logprob": logprob, "bytes": None,
                "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in (top or {}).items()]}
               for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]
    return {"content": content, "refusal": None}


def _head(completion: dict, obj: str) -> dict:
    return {"id": "chat" + completion["id"], "object": obj, "created": completion["created"],
            "model": completion["model"]}


def _delta(content: str, reasoning: str) -> dict:
    return {"content": content, "reasoning_content": reasoning} if reasoning else {"content": content}


def chat_completion(completion: dict, reasoning: Optional[ReasoningParser] = None, prompt: str = "") -> dict:
    """reasoning: how the reply (to prompt) spells its thinking, None: it is all content."""
    choice = completion["choices"][0]
    content, thought = reasoning.split(choice["text"], prompt) if reasoning else (choice["text"], "")
    message = {"role": "assistant", **_delta(content, thought)}
    return dict(_head(completion, "chat.completion"), usage=completion["usage"], choices=[{
        "index": 0, "message": message,
        "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": choice["finish_reason"]}])


def chat_chunks(chunks: Iterator[dict], reasoning: Optional[ReasoningParser] = None,
                prompt: str = "") -> Iterator[dict]:
    first = True
    splitter = reasoning.splitter(prompt) if reasoning else None
    for chunk in chunks:
        head = _head(chunk, "chat.completion.chunk")
        if first:
            yield dict(head, choices=[{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                       "finish_reason": None}])
            first = False
        choice = chunk["choices"][0]
        content, thought = choice["text"], ""
        if splitter is not None:
            content, thought = splitter.feed(content)
            if choice["finish_reason"] is not None:   # a reply cut off inside its thinking ends with what it has
                rest, rest_thought = splitter.finish()
                content, thought = content + rest, thought + rest_thought
        if content or thought or choice["logprobs"]:
            yield dict(head, choices=[{"index": 0, "delta": _delta(content, thought),
                                       "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": None}])
        if choice["finish_reason"] is not None:
            yield dict(head, choices=[{"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": choice["finish_reason"]}])
