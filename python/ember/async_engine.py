"""`AsyncLLMEngine`: vLLM's asyncio API over ember's engine. generate() is an async generator of
cumulative RequestOutputs; one background thread polls the engine and hands each request's
latest output to the event loop that awaits it."""
from __future__ import annotations

import asyncio
import atexit
import threading
import uuid
from typing import AsyncIterator, Dict, Optional

from .llm import LLM, engine_args_kwargs
from .outputs import RequestOutput
from .request_state import RequestState
from .sampling_params import SamplingParams


class _OutputSlot:
    """The newest output of one request, for the coroutine awaiting it. Outputs are cumulative,
    so a consumer slower than the engine loses nothing by seeing only the newest (vLLM does the
    same); an engine error arrives as the exception to raise."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel):
        self._loop = loop
        self._cancel = cancel
        self._item = None
        self._ready = asyncio.Event()

    def put(self, state: RequestState) -> None:
        """Called in the polling thread."""
        item = RuntimeError(f"ember engine: {state.error}") if state.error else state.output()
        try:
            self._loop.call_soon_threadsafe(self._set, item)
        except RuntimeError:   # the event loop has closed: nobody awaits this request any more
            state.on_update = None
            if not state.finished:
                self._cancel(state)

    def _set(self, item) -> None:
        self._item = item
        self._ready.set()

    async def get(self):
        await self._ready.wait()
        self._ready.clear()
        item, self._item = self._item, None
        if isinstance(item, BaseException):
            raise item
        return item


class _Done:
    """An awaitable that is already done: what abort() returns, so `await engine.abort(id)` and
    a plain `engine.abort(id)` both work (a coroutine left unawaited would warn)."""

    def __await__(self):
        return iter(())


class AsyncLLMEngine:
    """Construct it like LLM (it then owns its engine), or share an LLM's with from_llm()."""

    _POLL_S = 0.05   # how long one poll waits: bounds how late shutdown() sees its flag

    def __init__(self, model_path: Optional[str] = None, *, _llm: Optional[LLM] = None, **llm_kwargs):
        self._owns_llm = _llm is None
        self._llm = LLM(model_path, **llm_kwargs) if _llm is None else _llm
        # An encoder's LLM has no engine: it embeds and ranks (ember-server's pooling routes), never generates.
        self._client = None if self._llm._encoder_only() else self._llm._open_client()
        self._live: Dict[str, RequestState] = {}
        self._stop = threading.Event()
        self._pump = threading.Thread(target=self._pump_loop, name="ember-async-engine", daemon=True)
        self._pump.start()
        # A daemon thread frozen at exit inside a poll would keep the engine's poll lock, and the
        # LLM's __del__ then waits for it forever: stop polling before the interpreter finalizes.
        atexit.register(self._stop_pump)

    @classmethod
    def from_engine_args(cls, engine_args, **ignored) -> "AsyncLLMEngine":
        """vLLM's constructor from its AsyncEngineArgs: engine_args is an ember.AsyncEngineArgs,
        or any object (or dict) whose fields are LLM's keyword arguments; fields left None take
        LLM's defaults. Keywords such as usage_context are taken and ignored."""
        return cls(**engine_args_kwargs(engine_args))

    @classmethod
    def from_llm(cls, llm: LLM) -> "AsyncLLMEngine":
        """An AsyncLLMEngine on llm's engine; llm.generate keeps working alongside it, and
        shutdown() leaves llm open."""
        return cls(_llm=llm)

    @property
    def model_path(self) -> str:
        return self._llm.model_path

    @property
    def model(self):
        """The loaded weights (`_ember.Model`), as LLM.model."""
        return self._llm.model

    @property
    def tokenizer(self):
        """The model's `_ember.Tokenizer`."""
        return self._llm.tokenizer

    @property
    def n_ctx(self) -> int:
        """The longest sequence, prompt + generated tokens."""
        return self._llm.n_ctx

    @property
    def max_num_seqs(self) -> int:
        """Sequences decoded at once; more requests wait."""
        return self._llm.max_num_seqs

    def _pump_loop(self) -> None:
        try:
            while self._client is not None and not self._stop.is_set() and not self._client.closed:
                self._client.pump(self._POLL_S)
        except Exception as e:   # the engine failed: what awaits a request must not hang
            for state in list(self._live.values()):
                state.error = state.error or f"polling the engine failed: {e!r}"
                self._client.abandon(state)

    async def generate(self, prompt, sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Submits the request on first iteration and yields its RequestOutput as tokens arrive,
        each with the whole text so far; the last has finished=True. Leaving early (break,
        aclose, task cancellation) cancels the request in the engine."""
        if self._client is None:
            raise RuntimeError(f"AsyncLLMEngine: {self.model.arch} is an encoder model: it embeds and ranks, and "
                               f"does not generate")
        if not self._pump.is_alive():
            raise RuntimeError("AsyncLLMEngine: not running (shut down, or its engine closed or failed)")
        request_id = request_id if request_id is not None else f"req-{uuid.uuid4().hex}"
        if request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already running")
        slot = _OutputSlot(asyncio.get_running_loop(), lambda state: self._abandoned(request_id, state))
        state = self._client.submit(request_id, prompt, sampling_params or SamplingParams(), on_update=slot.put)
        self._live[request_id] = state
        try:
            while True:
                output = await slot.get()
                yield output
                if output.finished:
                    return
        finally:
            state.on_update = None
            del self._live[request_id]
            if not state.finished:
                self._client.cancel(state)

    def _abandoned(self, request_id: str, state: RequestState) -> None:
        """A request whose event loop closed under it (its generator can never run its cleanup)."""
        self._live.pop(request_id, None)
        self._client.cancel(state)

    def abort(self, request_id: str) -> "_Done":
        """Cancels a running request; its generator then yields a last output with finish_reason
        "abort". Unknown or finished: nothing happens. The cancel is made at once; the result may
        be awaited, as vLLM's coroutine is (`await engine.abort(id)`), or dropped."""
        state = self._live.get(request_id)
        if state is not None:
            self._client.cancel(state)
        return _Done()

    def abort_all(self) -> None:
        """Cancels every running request (ember-server at shutdown: open streams end at once,
        each with a last "abort" chunk, instead of being cut off)."""
        for state in list(self._live.values()):
            self._client.cancel(state)

    def stats(self) -> dict:
        """The engine's counters, as LLM.stats() (None for an encoder)."""
        return self._llm.stats()

    def _stop_pump(self) -> None:
        self._stop.set()
        self._pump.join()

    def shutdown(self) -> None:
        """Stops polling; running requests end with "abort" at once. Closes the engine when this
        AsyncLLMEngine made it."""
        atexit.unregister(self._stop_pump)
        self._stop_pump()
        for state in list(self._live.values()):
            self._client.abandon(state)
        if self._owns_llm:
            self._llm.close()
