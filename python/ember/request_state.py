"""`RequestState`: the Python side of one request, shared by LLM and AsyncLLMEngine. It holds the
request's sequences (one engine request each), takes in their engine outputs (incremental
detokenization, logprobs, and stop strings, which the C++ engine does not know: detokenize.py does
them) and builds the RequestOutput snapshots handed to callers."""
from __future__ import annotations

from typing import Callable, List, Optional

from .detokenize import Detokenizer, engine_logprob_entry
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams


class _Sequence:
    """One of a request's n sequences: one engine request."""

    def __init__(self, index: int, engine_id: int, detok: Detokenizer, want_logprobs: bool):
        self.index = index
        self.engine_id = engine_id
        self.detok = detok
        self.token_ids: List[int] = []
        self.logprobs: Optional[list] = [] if want_logprobs else None
        self.cumulative_logprob: Optional[float] = 0.0 if want_logprobs else None
        self.finish_reason: Optional[str] = None
        self.stop_reason = None
        # The engine sent this request's last output. A stop string ends the sequence here first;
        # the engine's "abort" follows within a step.
        self.engine_done = False


class RequestState:
    """A request as its caller sees it. apply() runs in whichever thread polls the engine, one
    output at a time; on_update (if set) is called there after each batch of outputs."""

    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: List[int],
                 params: SamplingParams, tokenizer):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self._tok = tokenizer
        self._special = not params.skip_special_tokens
        self.sequences: List[_Sequence] = []
        # The first prompt token has no logprob; the others come with sequence 0's first output.
        self.prompt_logprobs: Optional[list] = None if params.prompt_logprobs is None else [None]
        self.num_cached_tokens = 0
        self.error: Optional[str] = None
        self.on_update: Optional[Callable[["RequestState"], None]] = None

    def add_sequence(self, engine_id: int) -> _Sequence:
        detok = Detokenizer(self._tok, self.params.stop, self._special)
        seq = _Sequence(len(self.sequences), engine_id, detok, self.params.logprobs is not None)
        self.sequences.append(seq)
        return seq

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    @property
    def engine_done(self) -> bool:
        return all(s.engine_done for s in self.sequences)

    def apply(self, seq: _Sequence, out) -> bool:
        """Takes in one _ember.EngineOutput of seq. Returns True when a stop string ended seq, so
        the engine request must be cancelled."""
        seq.engine_done = out.finished
        if seq.finish_reason is not None:
            return False   # ended here already: tokens the engine made meanwhile are dropped
        if seq.index == 0:
            self.num_cached_tokens = out.num_cached_tokens
            if out.prompt_logprobs:
                tops = out.prompt_top_logprobs or [()] * len(out.prompt_logprobs)
                self.prompt_logprobs = [None] + [
                    engine_logprob_entry(self._tok, t, lp, rank, top, self._special)
                    for t, lp, rank, top in zip(self.prompt_token_ids[1:], out.prompt_logprobs, out.prompt_ranks, tops)]
        for i, token in enumerate(out.token_ids):
            seq.token_ids.append(token)
            if seq.logprobs is not None:
                top = out.top_logprobs[i] if out.top_logprobs else ()
                seq.logprobs.append(engine_logprob_entry(self._tok, token, out.logprobs[i], out.ranks[i], top,
                                                         self._special))
                seq.cumulative_logprob += out.logprobs[i]
            seq.detok.push(token, find_stops=self._finds_stops(seq))
            if self._ended_by_stop_string(seq):
                return not out.finished
        if out.finished:
            self._finish(seq, out)
        return False

    def _finds_stops(self, seq: _Sequence) -> bool:
        # As in vLLM, no stop string ends a sequence before min_tokens tokens.
        return len(seq.token_ids) >= self.params.min_tokens

    def _ended_by_stop_string(self, seq: _Sequence) -> bool:
        if not seq.detok.stopped:
            return False
        seq.stop_reason = seq.detok.stop_string
        seq.finish_reason = "stop"
        return True

    def _finish(self, seq: _Sequence, out) -> None:
        if out.finish_reason == "error":
            self.error = out.error or "the engine failed this request"
            seq.finish_reason = "error"
            return
        seq.detok.flush(find_stops=self._finds_stops(seq))
        if not self._ended_by_stop_string(seq):
            seq.finish_reason = out.finish_reason
            if out.stop_token_id >= 0:
                seq.stop_reason = out.stop_token_id

    def abort_unfinished(self, engine_done: bool = False) -> None:
        """Ends the unfinished sequences here with "abort" (engine_done: the engine will send
        nothing more, as after it was closed)."""
        for seq in self.sequences:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
            seq.engine_done = seq.engine_done or engine_done

    def output(self) -> RequestOutput:
        """A snapshot: later outputs do not change it."""
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=list(self.prompt_token_ids),
            prompt_logprobs=self.prompt_logprobs,
            outputs=[CompletionOutput(index=s.index, text=self._visible_text(s), token_ids=list(s.token_ids),
                                      cumulative_logprob=s.cumulative_logprob,
                                      logprobs=None if s.logprobs is None else list(s.logprobs),
                                      finish_reason=s.finish_reason, stop_reason=s.stop_reason)
                     for s in self.sequences],
            finished=self.finished, num_cached_tokens=self.num_cached_tokens)

    def _visible_text(self, seq: _Sequence) -> str:
        """While unfinished, the text less the end that may still grow into a stop string (which
        include_stop_str_in_output would show anyway)."""
        text = seq.detok.text
        if seq.detok.stopped and self.params.include_stop_str_in_output:
            return text + seq.detok.stop_string
        if seq.finish_reason is not None or self.params.include_stop_str_in_output:
            return text
        return text[:seq.detok.visible_end()]
