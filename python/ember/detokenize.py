"""Detokenizing a completion, for `Llama` and the engine's `RequestState` alike: token ids to text
that never splits a UTF-8 character, stop strings (the text cut before the earliest one), the end
of the text held back while it may still grow into a stop string, and each front end's logprobs."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from . import _ember
from .outputs import Logprob


def _decode(data) -> str:
    # The C++ detokenizer holds back split UTF-8 characters: only stray invalid bytes are dropped here.
    return bytes(data).decode("utf-8", errors="ignore")


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string: text
    that may still turn into a stop string and so must not be shown yet."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def find_stop(text: str, stops: Sequence[str], start: int) -> int:
    """Index of the earliest stop string occurrence in text[start:...], or -1."""
    found = -1
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (found < 0 or i < found):
            found = i
    return found


def _checked_stops(stops) -> List[str]:
    if isinstance(stops, (str, bytes)) or not isinstance(stops, Sequence):
        raise TypeError(f"stop strings must be a list of str, got {type(stops).__name__}")
    odd = next((s for s in stops if not isinstance(s, str)), None)
    if odd is not None:
        raise TypeError(f"stop strings must be str, got {odd!r} ({type(odd).__name__})")
    if not all(stops):
        # It would match before the first token.
        raise ValueError(f"a stop string cannot be empty, got {list(stops)!r}")
    return list(stops)


class Detokenizer:
    """One sequence's text. tokenizer: an `_ember.Tokenizer`; stops: the stop strings (none:
    only the text); special: special tokens are written out (vLLM's skip_special_tokens=False).

    `text` is the text so far; once a stop string is found it ends before the earliest one, which
    `stop_string` then names. After a stop string or flush() the detokenizer takes no more tokens."""

    def __init__(self, tokenizer, stops: Sequence[str] = (), special: bool = False):
        self.stops = _checked_stops(stops)
        self._longest = max(map(len, self.stops), default=0)
        self._detok = _ember.IncrementalDetokenizer(tokenizer, special)
        self.text = ""
        self.stop_string: Optional[str] = None
        self._flushed = False

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    def push(self, token: int, find_stops: bool = True) -> int:
        """Adds token's text (a UTF-8 character it leaves unfinished waits for the next tokens) and
        returns where that text starts. find_stops=False adds it without looking for stop strings
        (vLLM's min_tokens); a stop string it completes is then not found later either."""
        if self.stopped:
            raise RuntimeError(f"Detokenizer: the stop string {self.stop_string!r} ended this text; "
                               f"it takes no more tokens")
        if self._flushed:
            raise RuntimeError("Detokenizer: flush() ended this text; it takes no more tokens")
        start = len(self.text)
        self.text += _decode(self._detok.push(token))
        if find_stops:
            self._find_stop(start)
        return start

    def flush(self, find_stops: bool = True) -> None:
        """The sequence has ended: adds the bytes held back for an unfinished UTF-8 character
        (stray ones are dropped), which may still complete a stop string."""
        if self.stopped or self._flushed:
            return
        self._flushed = True
        start = len(self.text)
        self.text += _decode(self._detok.flush())
        if find_stops:
            self._find_stop(start)

    def _find_stop(self, start: int) -> None:
        # Text added at `start` completes a stop string beginning at most len(stop) - 1 before it.
        if not self.stops:
            return
        cut = find_stop(self.text, self.stops, max(0, start - self._longest + 1))
        if cut >= 0:
            self.stop_string = next(s for s in self.stops if self.text.startswith(s, cut))
            self.text = self.text[:cut]

    def visible_end(self) -> int:
        """How much of text may be shown now: all of it once stopped or flushed, else all but the end
        that may still grow into a stop string."""
        if self.stopped or self._flushed:
            return len(self.text)
        return len(self.text) - stop_prefix_len(self.text, self.stops)


# ---- logprobs ------------------------------------------------------------------------------
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis, in float64."""
    x = logits.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))


def piece_text(tokenizer, token: int) -> str:
    """A token's text as Llama reports it: a piece holding part of a UTF-8 character shows what
    decodes of it."""
    return _decode(tokenizer.token_to_piece(token, False))


def empty_completion_logprobs() -> dict:
    """llama-cpp-python's completion logprobs, with no token yet."""
    return {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}


def completion_logprob_entry(tokenizer, logprobs_row: np.ndarray, token: int, n_top: int) -> dict:
    """Llama's entry for the sampled token: its text, its logprob, and `top`, {text: logprob} of
    the n_top most likely tokens (the first of those spelled alike) and the sampled one.
    logprobs_row: [n_vocab] log-probabilities (log_softmax of the logits)."""
    top: Dict[str, float] = {}
    if n_top > 0:
        k = min(n_top, logprobs_row.shape[0])
        idx = np.argpartition(-logprobs_row, k - 1)[:k]
        for i in idx[np.argsort(-logprobs_row[idx], kind="stable")]:
            top.setdefault(piece_text(tokenizer, int(i)), float(logprobs_row[i]))
    lp = float(logprobs_row[token])
    text = piece_text(tokenizer, token)
    top[text] = lp
    return {"token": text, "logprob": lp, "top": top}


def engine_logprob(tokenizer, token: int, logprob: float, rank: int, special: bool) -> Logprob:
    """vLLM's Logprob of one token; a piece holding part of a UTF-8 character shows U+FFFD where
    its bytes are cut, as in vLLM."""
    piece = bytes(tokenizer.token_to_piece(token, special))
    return Logprob(logprob, rank, piece.decode("utf-8", errors="replace"))


def engine_logprob_entry(tokenizer, token: int, logprob: float, rank: int, top, special: bool) -> Dict[int, Logprob]:
    """vLLM's entry for a sampled token: {token id: Logprob} of the sampled token and of the
    engine's top candidates (top: (token id, logprob) pairs, most likely first; ties share the
    rank of the first of them)."""
    entry = {token: engine_logprob(tokenizer, token, logprob, rank, special)}
    rank, prev = 0, None
    for j, (t, lp) in enumerate(top):
        rank, prev = (rank if lp == prev else j + 1), lp
        if t not in entry:
            entry[t] = engine_logprob(tokenizer, t, lp, rank, special)
    return entry
