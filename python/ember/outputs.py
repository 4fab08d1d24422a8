"""`RequestOutput`, `CompletionOutput` and `Logprob`: vLLM's result records, as LLM.generate returns
them and AsyncLLMEngine.generate streams them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Union


class Logprob(float):
    """A token's logprob as vLLM gives it (`.logprob`, `.rank`: 1 + the tokens more likely than it,
    `.decoded_token`: its text) that is also the plain float, so code written for either works."""
    __slots__ = ("rank", "decoded_token")

    def __new__(cls, logprob: float, rank: Optional[int] = None, decoded_token: Optional[str] = None):
        self = super().__new__(cls, logprob)
        self.rank = rank
        self.decoded_token = decoded_token
        return self

    @property
    def logprob(self) -> float:
        return float(self)

    def __getnewargs__(self):
        return float(self), self.rank, self.decoded_token

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"


@dataclass
class CompletionOutput:
    """One generated sequence of a request (index: which of its n).

    text: the text so far, any stop string cut off (while streaming, the end that may still grow
    into a stop string is held back). token_ids: the generated tokens; unlike vLLM's, they leave
    out the EOS or stop_token_ids token that ended the sequence, as the engine (and Llama) do.
    logprobs: None unless asked for, else one dict per generated token mapping token id -> Logprob,
    holding the sampled token and the top `logprobs` candidates. cumulative_logprob: the sampled
    tokens' logprobs summed, None unless logprobs were asked for. finish_reason: None until
    finished, then "stop", "length" or "abort". stop_reason: the stop string or the stop_token_ids
    entry that ended it, else None (also where an end-of-generation token ended it, as in vLLM).
    reasoning_content: LLM.chat's harmony replies (gpt-oss) only, the analysis channel, text being
    the final channel; else None."""
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, Logprob]]]
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[str, int]] = None
    reasoning_content: Optional[str] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state: its prompt (None where it was given as token ids), the prompt's tokens,
    prompt_logprobs (None unless asked for, else one entry per prompt token: None for the first,
    then {token id: Logprob} for that token given the ones before), one CompletionOutput per
    sequence, whether every sequence has finished, and how many prompt tokens the prefix cache
    served (for sequence 0)."""
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[List[Optional[Dict[int, Logprob]]]]
    outputs: List[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
