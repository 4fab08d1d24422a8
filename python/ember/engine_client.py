"""`EngineClient`: one `_ember.Engine` as LLM and AsyncLLMEngine share it. It turns prompts into
engine requests (one per sequence of a request), polls the engine and routes each output to its
RequestState, cancels, and closes.

Any thread may poll (LLM.generate in the caller's thread, AsyncLLMEngine in its own): polling and
applying outputs is serialized, so a request's outputs are applied in order whoever polls, and an
output polled by one thread for another's request is applied all the same."""
from __future__ import annotations

import dataclasses
import random
import threading
from typing import Callable, Dict, Optional, Tuple

from .prompt import encode_prompt
from .request_state import RequestState, _Sequence
from .sampling_params import SamplingParams


class EngineClient:
    def __init__(self, engine, tokenizer, seed: Optional[int] = None):
        self.engine = engine
        self._tok = tokenizer
        # LLM(seed=...): requests without a seed of their own draw one from here, reproducibly.
        self._seeds = None if seed is None else random.Random(seed)
        self._routes: Dict[int, Tuple[RequestState, _Sequence]] = {}   # engine request id -> its sequence
        # Held across add_request and the route it gets, so no poll can see an output before its route.
        self._submit_lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self.closed = False

    def submit(self, request_id: str, prompt, params: SamplingParams,
               on_update: Optional[Callable[[RequestState], None]] = None) -> RequestState:
        """Adds a request: prompt is a str, token ids, or a vLLM prompt dict ({"prompt": str} or
        {"prompt_token_ids": [...]}; with both, the ids are generated from and the text is the
        output's prompt). ValueError where the prompt leaves no room in the context for a
        generated token; max_tokens beyond the room is capped at it (the sequence then ends with
        finish_reason "length" at the end of the context), as vLLM's LLM and llama-cpp-python do."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt and "prompt" not in prompt:
                raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
            text = prompt.get("prompt")
            prompt = prompt.get("prompt_token_ids", text)
        token_ids = encode_prompt(self._tok, prompt)
        n_ctx = self.engine.n_ctx
        room = n_ctx - len(token_ids)
        if room < 1:
            n = len(token_ids)
            raise ValueError(f"the prompt is {n} token{'s' if n != 1 else ''} and n_ctx is {n_ctx}: "
                             f"no room for a generated token (n_ctx must be at least {n + 1})")
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        if params.seed is None and self._seeds is not None:
            params = dataclasses.replace(params, seed=self._seeds.randrange(1 << 31))
        state = RequestState(request_id, text, token_ids, params, self._tok)
        state.on_update = on_update
        try:
            for index in range(params.n):
                with self._submit_lock:
                    if self.closed:
                        raise ValueError("LLM: this engine was closed")
                    engine_id = self.engine.add_request(token_ids, **params.engine_kwargs(index, max_tokens))
                    self._routes[engine_id] = (state, state.add_sequence(engine_id))
        except BaseException:
            self.cancel(state)
            raise
        return state

    def pump(self, timeout: float) -> None:
        """Polls the engine once, waiting up to timeout seconds, and applies what came."""
        with self._poll_lock:
            if self.closed:
                return
            updated: Dict[RequestState, None] = {}
            for out in self.engine.poll(timeout):
                with self._submit_lock:
                    state, seq = self._routes[out.request_id]
                    if out.finished:
                        del self._routes[out.request_id]
                if state.apply(seq, out):
                    self.engine.cancel(seq.engine_id)
                updated[state] = None
            for state in updated:
                if state.on_update is not None:
                    state.on_update(state)

    def cancel(self, state: RequestState) -> None:
        """Asks the engine to end state's requests; their last outputs ("abort") come by pump."""
        if self.closed:
            return
        for seq in state.sequences:
            if not seq.engine_done:
                self.engine.cancel(seq.engine_id)

    def abandon(self, state: RequestState) -> None:
        """Cancels state's requests and ends them here at once, without waiting for the engine."""
        self.cancel(state)
        with self._poll_lock:
            state.abort_unfinished()
            if state.on_update is not None:
                state.on_update(state)

    def close(self) -> None:
        """Stops the engine; the requests still running end with "abort"."""
        with self._poll_lock:
            with self._submit_lock:
                if self.closed:
                    return
                self.closed = True
                states = dict.fromkeys(state for state, _ in self._routes.values())
                self._routes.clear()
            self.engine.close()
            for state in states:
                state.abort_unfinished(engine_done=True)
                if state.on_update is not None:
                    state.on_update(state)
