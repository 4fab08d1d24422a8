"""`SamplingParams`: vLLM's per-request sampling settings, validated, and their translation into
the keyword arguments of `_ember.Engine.add_request`."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from typing import Dict, List, Optional, Union

from . import _ember
from .structured import StructuredOutputsParams

RANDOM_SEED = 0xFFFFFFFF   # the engine's "draw a random seed", as in llama.cpp

_INT_FIELDS = {"n", "top_k", "max_tokens", "min_tokens", "seed", "logprobs", "prompt_logprobs"}
_OPTIONAL = {"max_tokens", "seed", "logprobs", "prompt_logprobs", "stop", "stop_token_ids", "logit_bias",
             "structured_outputs"}
_BOOL_FIELDS = {"ignore_eos", "include_stop_str_in_output", "skip_special_tokens"}


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _type_error(params: "SamplingParams") -> Optional[str]:
    """What is of the wrong type, named, so a bad value fails here and not deep in the engine."""
    for f in fields(params):
        v = getattr(params, f.name)
        if v is None and f.name in _OPTIONAL:
            continue
        if f.name in _BOOL_FIELDS:
            ok, want = isinstance(v, bool), "a bool"
        elif f.name in _INT_FIELDS:
            ok, want = _is_int(v), "an integer"
        elif f.name == "stop":
            ok = isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v))
            want = "a string or a list of strings"
        elif f.name == "stop_token_ids":
            ok, want = isinstance(v, (list, tuple)) and all(map(_is_int, v)), "a list of token ids"
        elif f.name == "structured_outputs":
            ok, want = isinstance(v, StructuredOutputsParams), "a StructuredOutputsParams"
        elif f.name == "logit_bias":
            ok = isinstance(v, dict) and all(_is_int(k) and _is_real(b) for k, b in v.items())
            want = "a dict of token id -> bias"
        else:
            ok, want = _is_real(v), "a number"
        if not ok:
            return f"SamplingParams: {f.name} must be {want}, got {v!r}"
    return None


@dataclass
class SamplingParams:
    """vLLM's SamplingParams (the subset ember implements). temperature 0 is greedy; top_k -1 or 0
    is off; max_tokens None generates until the context is full; n > 1 runs n sequences, seeded
    seed, seed+1, ... when seed is given. Penalties look at the last 64 tokens (llama.cpp's
    window), not at the whole sequence as in vLLM. include_stop_str_in_output keeps the stop
    string that ended a sequence at the end of its text (and streams text without holding back
    what may grow into one). prompt_logprobs=k gives each prompt token after the first its logprob
    and those of the k most likely tokens at its position. structured_outputs constrains the text to
    a JSON schema, regex, choice or grammar (ember.structured); only tokens it allows are drawn."""
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    seed: Optional[int] = None
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: Optional[Dict[int, float]] = None
    structured_outputs: Optional[StructuredOutputsParams] = None

    def __post_init__(self):
        wrong_type = _type_error(self)
        if wrong_type:
            raise TypeError(wrong_type)
        # vLLM's own bounds, so code written for vLLM fails here the way it fails there.
        checks = [
            ("n", self.n >= 1, "must be at least 1"),
            ("temperature", self.temperature >= 0.0, "must be non-negative"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", self.top_k >= -1, "must be -1 or 0 (off) or at least 1"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "must be in [0, 1]"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be at least 1 (or None)"),
            ("min_tokens", self.min_tokens >= 0, "must be non-negative"),
            ("min_tokens", self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"must not exceed max_tokens={self.max_tokens}"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= _ember.MAX_LOGPROBS,
             f"must be in [0, {_ember.MAX_LOGPROBS}] (or None)"),
            ("prompt_logprobs", self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= _ember.MAX_LOGPROBS,
             f"must be in [0, {_ember.MAX_LOGPROBS}] (or None)"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0.0, "must be greater than zero"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"SamplingParams: {name} {rule}, got {getattr(self, name)!r}")
        if self.seed is not None and not (0 <= self.seed and self.seed + self.n <= 1 << 64
                                          and not self.seed <= RANDOM_SEED < self.seed + self.n):
            # seed + i for the n sequences must stay a uint64 and never be the "random" value.
            raise ValueError(f"SamplingParams: seed must be in [0, 2**64 - n] and seed..seed+n-1 must not "
                             f"include {RANDOM_SEED:#x} (ember's 'random seed'), got {self.seed!r}")
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if not all(self.stop):   # as vLLM: an empty string would match before the first token
            raise ValueError(f"SamplingParams: stop cannot contain an empty string, got {self.stop!r}")
        self.stop_token_ids = [int(t) for t in self.stop_token_ids or []]

    def engine_kwargs(self, index: int, max_tokens: int) -> dict:
        """add_request's keyword arguments for sequence `index` of the n, generating at most
        max_tokens (this max_tokens capped at the context's room, or the room where it is None;
        min_tokens is capped alike). The prompt's logprobs are asked of sequence 0 only: the n
        share the prompt. ValueError naming what is wrong with structured_outputs."""
        kind, grammar = self.structured_outputs.grammar_spec() if self.structured_outputs else ("", "")
        return dict(
            temperature=self.temperature, top_k=max(self.top_k, 0), top_p=self.top_p, min_p=self.min_p,
            repeat_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=[(int(t), float(b)) for t, b in (self.logit_bias or {}).items()],
            seed=RANDOM_SEED if self.seed is None else self.seed + index,
            max_tokens=max_tokens, min_tokens=min(self.min_tokens, max_tokens), stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, logprobs=-1 if self.logprobs is None else self.logprobs,
            prompt_logprobs=self.prompt_logprobs is not None and index == 0,
            prompt_top_logprobs=(self.prompt_logprobs or 0) if index == 0 else 0, grammar_kind=kind, grammar=grammar)
