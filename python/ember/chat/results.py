"""llama-cpp-python's chat results from Llama's completion results: `chat.completion` and
`chat.completion.chunk` dicts (the role in the first delta, the finish_reason in a last empty
one, logprobs in the chat format), for Llama.create_chat_completion."""
from __future__ import annotations

from typing import Iterator, Optional


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


def chat_completion(completion: dict) -> dict:
    choice = completion["choices"][0]
    return dict(_head(completion, "chat.completion"), usage=completion["usage"], choices=[{
        "index": 0, "message": {"role": "assistant", "content": choice["text"]},
        "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": choice["finish_reason"]}])


def chat_chunks(chunks: Iterator[dict]) -> Iterator[dict]:
    first = True
    for chunk in chunks:
        head = _head(chunk, "chat.completion.chunk")
        if first:
            yield dict(head, choices=[{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                       "finish_reason": None}])
            first = False
        choice = chunk["choices"][0]
        if choice["text"] or choice["logprobs"]:
            yield dict(head, choices=[{"index": 0, "delta": {"content": choice["text"]},
                                       "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": None}])
        if choice["finish_reason"] is not None:
            yield dict(head, choices=[{"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": choice["finish_reason"]}])
