"""llama-cpp-python's chat results from Llama's completion results: `chat.completion` and
`chat.completion.chunk` dicts (the role in the first delta, the finish_reason in a last empty
one, logprobs in the chat format), for Llama.create_chat_completion. A harmony reply (gpt-oss) is
split as ember-server splits it: content is the final channel, reasoning_content (llama-server's
field) the analysis channel."""
from __future__ import annotations

from typing import Iterator, Optional

from .harmony import HarmonySplitter, split_harmony


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


def chat_completion(completion: dict, harmony: bool = False) -> dict:
    """harmony: the text is a harmony reply, its special tokens written out."""
    choice = completion["choices"][0]
    content, reasoning = split_harmony(choice["text"]) if harmony else (choice["text"], "")
    message = {"role": "assistant", **_delta(content, reasoning)}
    return dict(_head(completion, "chat.completion"), usage=completion["usage"], choices=[{
        "index": 0, "message": message,
        "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": choice["finish_reason"]}])


def chat_chunks(chunks: Iterator[dict], harmony: bool = False) -> Iterator[dict]:
    first = True
    splitter = HarmonySplitter() if harmony else None
    for chunk in chunks:
        head = _head(chunk, "chat.completion.chunk")
        if first:
            yield dict(head, choices=[{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                       "finish_reason": None}])
            first = False
        choice = chunk["choices"][0]
        content, reasoning = choice["text"], ""
        if splitter is not None:
            content, reasoning = splitter.feed(content)
            if choice["finish_reason"] is not None:   # a reply cut off inside a channel ends with what it has
                rest, rest_reasoning = splitter.finish()
                content, reasoning = content + rest, reasoning + rest_reasoning
        if content or reasoning or choice["logprobs"]:
            yield dict(head, choices=[{"index": 0, "delta": _delta(content, reasoning),
                                       "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": None}])
        if choice["finish_reason"] is not None:
            yield dict(head, choices=[{"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": choice["finish_reason"]}])
