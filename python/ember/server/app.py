"""The FastAPI application: `create_app(engine_or_args)` and its routes. OpenAI's /v1/models,
/v1/completions and /v1/chat/completions (JSON or server-sent events), /v1/embeddings, /v1/rerank and
/score (pooling_routes.py), llama-server's /health, /tokenize and /detokenize, Prometheus' /metrics and
the chat page at /. Every generation runs on one AsyncLLMEngine, so all connections share its batch;
embeddings and ranks run in a worker thread beside it on an Embedder that shares the engine's weights
(concurrent requests' inputs run together; an encoder packs them into few forwards). The CPU work of
a request (parsing its body, rendering the chat template, tokenizing) runs in a worker pool, so
the event loop, and with it /health and every running stream, never waits on one request.
On shutdown the server drains (drain()): new requests get 503, running ones may finish until a
deadline, then each is aborted, so streams end with a finish_reason chunk and [DONE].

Given parsed command-line arguments, the app starts listening at once and loads the model in a
thread (/health says 503 until it is ready); given an AsyncLLMEngine, it serves that one and
leaves it open at shutdown."""
from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import logging
import os
import pathlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Callable, List, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..async_engine import AsyncLLMEngine
from ..chat import ChatTemplate, ChatTemplateError, TemplateBudgetError, ToolCallParser
from ..chat import constrain
from ..chat.reasoning import ReasoningParser
from ..embed_batching import BatchingEmbedder
from ..embedding import POOLING_NONE, POOLING_RANK, Embedder, is_encoder, resolve_pooling
from ..prompt import encode_prompt
from . import args as server_args
from . import client_routes, pooling_routes
from . import constraints
from .client_routes import shorten_embeddings
from .args import ServerSettings
from .metrics import Metrics, RequestTimer
from .merge import newest_outputs
from .middleware import Gate
from .openai_schema import (APIError, EmbeddingRequest, GenerationRequest, bad_param, get, parse_chat,
                            parse_completion, parse_embeddings, read_json)
from .responses import SSE_DONE, ResponseBuilder, embedding_list, sse

log = logging.getLogger("ember.server")

STATIC = pathlib.Path(__file__).resolve().parent / "static"
RETRY_AFTER_S = 1   # a full queue drains in about a request's time; clients back off from there
LOAD_LOG_EVERY_S = 10.0   # how often a model still loading says so in the log
JSON_TYPES = ("application/json",)   # what a JSON endpoint's body may be sent as


class _Admission:
    """n sequences check_queue let in, counted in the server's `admitted` until released: by the
    request's end, or by this object's, which covers a request that failed before it ran."""

    def __init__(self, srv: "_Server", n: int):
        self._srv, self._n = srv, n
        srv.admitted += n

    def release(self) -> None:
        self._srv.admitted -= self._n
        self._n = 0

    __del__ = release


class _ChunkedBody(Response):
    """A JSON response whose body goes to the server a chunk at a time (with its Content-Length):
    one write of tens of MB would hold the event loop for the copy."""

    def __init__(self, chunks: List[bytes]):
        super().__init__(media_type="application/json")
        self.chunks = chunks
        self.headers["content-length"] = str(sum(len(c) for c in chunks))

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class _Server:
    """The app's state: the engine once loaded, and what is read from it once."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.metrics = Metrics()
        self.engine: Optional[AsyncLLMEngine] = None
        self.owns_engine = False
        self.load_error: Optional[BaseException] = None
        self._embedder: Optional[BatchingEmbedder] = None   # made at the first /v1/embeddings (it takes memory)
        self._embedder_lock = threading.Lock()
        # Threads, not processes: tokenizing releases the GIL, and pure-Python work (templates,
        # JSON) gives it back to the event loop every few milliseconds.
        self._pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                                        thread_name_prefix="ember-server-cpu")
        self.draining = False
        self.admitted = 0   # sequences let in by check_queue whose requests have not ended
        self._live: dict = {}   # engine request id -> its response's id, while it runs

    def attach(self, engine: AsyncLLMEngine, owns: bool) -> None:
        self.tok = engine.tokenizer
        self.n_ctx = engine.n_ctx
        self.max_num_seqs = engine.max_num_seqs
        self.model_path = engine.model_path
        self.model_id = self.settings.alias or os.path.basename(self.model_path)
        self.template = ChatTemplate.for_model(self.model_path, self.tok, self.settings.chat_template)
        style = self.settings.tool_call_parser
        self.tool_parser = ToolCallParser(style) if style else ToolCallParser.for_template(self.template.source)
        # How replies spell their thinking (gpt-oss's channels, <think> tags), split out as reasoning_content.
        self.reasoning = ReasoningParser.for_template(self.template.source, self.settings.reasoning_parser)
        self.spell = constrain.spelling(self.tok)   # tags that are one special token, as grammars name them
        self.model = engine.model
        self.pooling = resolve_pooling(self.model, self.settings.pooling)
        self.encoder = is_encoder(self.model)   # it embeds and ranks, and never generates
        self.owns_engine = owns
        self.engine = engine   # last: a request sees the engine only once the rest is set

    def load(self, args: argparse.Namespace, on_load_failed: Optional[Callable[[BaseException], None]]) -> None:
        """Loads the model (in its own thread: the server answers /health meanwhile)."""
        t0 = time.perf_counter()
        log.info("loading %s ...", args.model)
        loaded = threading.Event()
        threading.Thread(target=self._still_loading, args=(args.model, t0, loaded), name="ember-server-load-log",
                         daemon=True).start()
        try:
            engine = AsyncLLMEngine(args.model, **server_args.engine_kwargs(args))
            try:
                self.attach(engine, owns=True)
            except BaseException:
                engine.shutdown()
                raise
        except Exception as e:
            self.load_error = e
            if on_load_failed is not None:
                on_load_failed(e)
            else:
                log.error("loading %s failed: %s", args.model, e)
            return
        finally:
            loaded.set()
        # What the process holds now (modules, the model's objects) lives until exit: out of the
        # collector's generations, a full collection walks only what requests made, not all of it.
        gc.freeze()
        log.info("model %s ready in %.1f s (n_ctx %d, %d sequences at once, chat template: %s, tool calls: %s)",
                 self.model_id, time.perf_counter() - t0, self.n_ctx, self.max_num_seqs, self.template.origin,
                 self.tool_parser.style)

    @staticmethod
    def _still_loading(model: str, t0: float, loaded: threading.Event) -> None:
        # A large model takes minutes to read (and to copy to the GPU): say that it is not stuck.
        while not loaded.wait(LOAD_LOG_EVERY_S):
            log.info("still loading %s (%.0f s)", model, time.perf_counter() - t0)

    def ready(self) -> AsyncLLMEngine:
        if self.engine is None:
            message = f"loading the model failed: {self.load_error}" if self.load_error else "Loading model"
            raise APIError(503, message, type="unavailable_error", code="model_loading",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        return self.engine

    def decoding(self) -> bool:
        """Whether the engine is generating now: embedding forwards on the same cores then yield to it."""
        stats = self.engine.stats() if self.engine is not None else None
        return bool(stats and stats["running"])

    def close(self) -> None:
        self._embedder = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.engine is not None and self.owns_engine:
            self.engine.shutdown()

    async def cpu(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) in the worker pool: CPU work of one request that must not hold up
        the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def reply(self, fn, *args) -> Response:
        """The JSON response of fn(*args), built and serialized in the worker pool: a large body
        (pieces of megabytes of tokens, logprobs, embeddings) takes seconds to encode."""
        return _ChunkedBody(await self.cpu(_json_chunks, fn, *args))

    def drain(self, timeout: float) -> None:
        """Stops taking requests; those running may finish for timeout seconds, then are aborted
        (streams end with finish_reason "abort", waiting non-streamed requests get a 503)."""
        self.draining = True
        log.info("draining: %d requests running, %.0f s to finish", len(self._live), timeout)
        asyncio.get_running_loop().call_later(timeout, self._abort_all)

    def _abort_all(self) -> None:
        if self._live:
            log.info("shutdown timeout: aborting %d requests", len(self._live))
        for request_id in list(self._live):
            self.engine.abort(request_id)

    def check_open(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down", type="unavailable_error", code="shutting_down",
                           headers={"Connection": "close"})

    # ---- requests ------------------------------------------------------------------------
    async def body(self, request: Request) -> dict:
        """The JSON body, read up to the size limit: 413 past it, or at once where Content-Length
        says it will be (a client that announces more sends more, or hangs waiting); 415 unless
        it is sent as JSON (a browser posts forms and text/plain across origins without asking);
        408 when it does not arrive within --timeout. Parsed in the worker pool."""
        self.check_open()
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media not in JSON_TYPES:
            raise APIError(415, f"the request body must be JSON, sent with `Content-Type: application/json` "
                                f"(got {media or 'no Content-Type'})", code="unsupported_media_type")
        limit = self.settings.max_body_bytes
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise APIError(413, f"the request body is larger than {limit} bytes (Content-Length: {length})",
                           code="request_too_large")
        raw = bytearray()
        try:
            async with asyncio.timeout(self.settings.timeout):
                async for part in request.stream():
                    raw += part
                    if len(raw) > limit:
                        raise APIError(413, f"the request body is larger than {limit} bytes",
                                       code="request_too_large")
        except TimeoutError:
            raise APIError(408, f"the request body did not arrive within {self.settings.timeout:g} s (--timeout)",
                           code="request_timeout", headers={"Connection": "close"}) from None
        return await self.cpu(read_json, bytes(raw))

    def check_model(self, model: Optional[str]) -> None:
        if model is not None and model not in (self.model_id, self.model_path):
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.model_id}'",
                           param="model", code="model_not_found")

    def check_room(self, n_prompt: int, req: GenerationRequest, which: str = "the prompt") -> None:
        wanted = n_prompt + (req.params.max_tokens or 1)
        if wanted > self.n_ctx:
            param = "max_tokens" if n_prompt < self.n_ctx else "messages" if req.messages is not None else "prompt"
            raise APIError(400, f"This model's maximum context length is {self.n_ctx} tokens. However, you requested "
                                f"{wanted} tokens ({n_prompt} in {which}, {wanted - n_prompt} for the completion).",
                           param=param, code="context_length_exceeded")

    def check_queue(self, n: int, n_prompts: int) -> "_Admission":
        """400 when the request's n sequences could never all be let in, 503 when they would make
        more than max_queue wait for a slot now. Those let in count as busy from here until the
        request ends (the _Admission), not from when the engine sees them: a burst that arrives
        at once is counted request by request."""
        room = self.max_num_seqs + self.settings.max_queue
        if n > room:
            asked = f"{n_prompts} prompts x n={n // n_prompts}" if n_prompts > 1 else f"n={n}"
            raise bad_param("n", f"this request runs {n} sequences ({asked}), more than this server ever holds: "
                                 f"{self.max_num_seqs} running (--max-num-seqs) + {self.settings.max_queue} "
                                 f"waiting (--max-queue)")
        stats = self.engine.stats()
        busy = max(stats["running"] + stats["waiting"], self.admitted)
        if busy + n - self.max_num_seqs > self.settings.max_queue:
            self.metrics.count("rejected")
            raise APIError(503, f"the server is busy: {max(0, busy - self.max_num_seqs)} requests are waiting "
                                f"already (--max-queue {self.settings.max_queue}); retry later",
                           type="server_error", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
        return _Admission(self, n)

    async def generate(self, request: Request, req: GenerationRequest, prompts: List[Tuple[List[int], str]],
                       chat: bool, tool_parser: Optional[ToolCallParser] = None,
                       reasoning: Optional[ReasoningParser] = None):
        """Runs the request: prompts are (token ids, text) pairs, one engine request each;
        tool_parser: the syntax that chat replies are parsed for tool calls in, or None; reasoning:
        how chat replies spell their thinking, or None."""
        engine = self.ready()
        self.check_open()
        self.check_model(req.model)
        if self.settings.embedding_only or self.encoder:
            why = f"its model ({self.model.arch}) is an encoder" if self.encoder else \
                "it was started with --embedding (or --reranking)"
            raise APIError(400, f"this server embeds and ranks, and does not generate: {why}",
                           code="generation_not_supported")
        for i, (ids, _) in enumerate(prompts):
            self.check_room(len(ids), req, f"prompt[{i}]" if len(prompts) > 1 else "the prompt")
        admission = self.check_queue(req.params.n * len(prompts), len(prompts))
        if chat and reasoning is not None and reasoning.keeps_special:
            req.params.skip_special_tokens = False   # the thinking's markers are special tokens
        builder = ResponseBuilder(req, self.model_id, self.tok, [text for _, text in prompts], chat, tool_parser,
                                  reasoning)
        timer = RequestTimer(self.metrics)
        # The engine's request ids: the response's id, numbered when there are several prompts.
        request_ids = [builder.id] if len(prompts) == 1 else [f"{builder.id}-{i}" for i in range(len(prompts))]
        outputs = self._tracked(newest_outputs([engine.generate(ids, req.params, request_id=request_id)
                                                for (ids, _), request_id in zip(prompts, request_ids)]), request_ids,
                                admission)
        if req.stream:
            return StreamingResponse(self._events(request, outputs, builder, timer), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        task = asyncio.ensure_future(self._last_outputs(outputs, req.params.n, timer))
        # Nothing is sent until the end, so a client that leaves is noticed by asking: its request
        # is then cancelled (the generator, closed by the cancellation, cancels it in the engine).
        while not task.done():
            await asyncio.wait({task}, timeout=0.2)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self._note(request, builder, timer, [], "disconnected")
                return Response(status_code=499)
        try:
            finals = task.result()
        except (RuntimeError, ValueError) as e:   # the engine failed, or was closed under the request
            self._note(request, builder, timer, [], "error")
            log.debug("%s failed", builder.id, exc_info=True)
            raise APIError(500, f"generation failed: {e}", type="server_error") from e
        self._note(request, builder, timer, finals, finals[0].outputs[0].finish_reason)
        if self.draining and any(o.finish_reason == "abort" for f in finals for o in f.outputs):
            raise APIError(503, "the server shut down before this request finished; retry it elsewhere or later",
                           type="unavailable_error", code="shutting_down", headers={"Connection": "close"})
        return await self.reply(builder.response, finals)

    async def _tracked(self, outputs, request_ids: List[str], admission: "_Admission"):
        """outputs, with its engine requests known to drain() while it runs; the admission ends
        with it (or with this generator, unstarted, when a stream's client left before it began)."""
        for request_id in request_ids:
            self._live[request_id] = True
        try:
            async for item in outputs:
                yield item
        finally:
            admission.release()
            for request_id in request_ids:
                self._live.pop(request_id, None)
            await outputs.aclose()

    async def embed(self, request: Request, req: EmbeddingRequest) -> Response:
        self.check_model(req.model)
        if self.pooling == POOLING_RANK:
            raise APIError(400, "this server ranks (pooling rank, --reranking): it scores (query, document) pairs "
                                "at /v1/rerank and gives no embeddings", code="pooling_not_supported")
        if self.pooling == POOLING_NONE:   # llama-server's answer: OpenAI's format has one vector per input
            raise APIError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type "
                                "(this model's GGUF names none: start ember-server with --pooling mean, cls or last)",
                           code="pooling_not_supported")
        seqs = await self.cpu(lambda: [encode_prompt(self.tok, x) if isinstance(x, str) else x for x in req.inputs])
        for i, seq in enumerate(seqs):
            if len(seq) > self.n_ctx:
                raise APIError(400, f"This model's maximum context length is {self.n_ctx} tokens. However, "
                                    f"input[{i}] is {len(seq)} tokens.", param="input", code="context_length_exceeded")
        t0 = time.perf_counter()
        try:
            vectors = await asyncio.to_thread(lambda: self.embedder().embed_batch(seqs))
        except ValueError as e:
            raise APIError(400, str(e), param="input", code="invalid_value") from None
        if req.dimensions is not None:
            vectors = shorten_embeddings(vectors, req.dimensions)
        n_tokens = sum(len(seq) for seq in seqs)
        request.state.log = f"embeddings inputs={len(seqs)} prompt={n_tokens} " \
                            f"total={(time.perf_counter() - t0) * 1e3:.0f}ms"
        return await self.reply(embedding_list, vectors, self.model_id, n_tokens, req.encoding_format)

    def embedder(self) -> BatchingEmbedder:
        with self._embedder_lock:
            if self._embedder is None:
                # Concurrent requests' inputs share forwards (an encoder packs them).
                self._embedder = BatchingEmbedder(Embedder(self.model, self.n_ctx, self.pooling), busy=self.decoding)
            return self._embedder

    @staticmethod
    async def _last_outputs(outputs, n: int, timer: RequestTimer) -> list:
        """Each prompt's last output, in prompt order (n: choices per prompt)."""
        last = {}
        try:
            async for p, out in outputs:
                timer.observe(out, p * n)
                last[p] = out
        finally:
            await outputs.aclose()
        return [last[p] for p in sorted(last)]

    async def _events(self, request: Request, outputs, builder: ResponseBuilder, timer: RequestTimer):
        """The SSE stream. A client that disconnects ends it (Starlette cancels or closes this
        generator), and closing `outputs` cancels the requests in the engine."""
        last, outcome = {}, "disconnected"
        try:
            for chunk in builder.opening_chunks():
                yield sse(chunk)
            async for p, out in outputs:
                timer.observe(out, p * builder.req.params.n)
                for chunk in builder.chunks(p, out):
                    yield sse(chunk)
                last[p] = out
            outcome = last[0].outputs[0].finish_reason
            if builder.req.include_usage:
                yield sse(builder.usage_chunk([last[p] for p in sorted(last)]))
            yield SSE_DONE
        except Exception as e:   # as in generate(); the status has gone out, so an event says it
            outcome = f"error: {type(e).__name__}: {e}"
            log.debug("%s failed", builder.id, exc_info=True)
            yield sse(APIError(500, "generation failed" if not isinstance(e, (RuntimeError, ValueError)) else
                               f"generation failed: {e}", type="server_error").body())
            yield SSE_DONE
        finally:
            await outputs.aclose()
            self._note(request, builder, timer, [last[p] for p in sorted(last)], outcome)

    def _note(self, request: Request, builder: ResponseBuilder, timer: RequestTimer, finals: list,
              outcome: str) -> None:
        """Counts the request in the metrics and gives the log line its details (finals: the last
        outputs of the prompts that had one)."""
        elapsed = timer.finish(outcome)
        counts = builder.usage(finals) if finals else None
        usage = f" prompt={counts['prompt_tokens']} completion={counts['completion_tokens']}" if counts else ""
        ttft = f" ttft={timer.first_token_s * 1e3:.0f}ms" if timer.first_token_s is not None else ""
        request.state.log = f"{builder.id} {outcome}{usage}{ttft} total={elapsed * 1e3:.0f}ms"


def create_app(engine_or_args, settings: Optional[ServerSettings] = None,
               on_load_failed: Optional[Callable[[BaseException], None]] = None) -> FastAPI:
    """The server on an AsyncLLMEngine (ready at once; settings: ServerSettings()), or on parsed
    `ember-server` arguments (the model loads when the app starts; settings come from them).
    on_load_failed(error) is called in the loading thread if the model cannot be loaded."""
    if isinstance(engine_or_args, AsyncLLMEngine):
        srv = _Server(settings or ServerSettings())
        srv.attach(engine_or_args, owns=False)
    else:
        srv = _Server(settings or server_args.settings(engine_or_args))

    @asynccontextmanager
    async def lifespan(app):
        if srv.engine is None:
            threading.Thread(target=srv.load, args=(engine_or_args, on_load_failed), name="ember-server-load",
                             daemon=True).start()
        yield
        srv.close()

    app = FastAPI(title="ember-server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = srv
    app.add_middleware(Gate, api_key=srv.settings.api_key, cors_origins=srv.settings.cors_origins,
                       send_timeout=srv.settings.timeout)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        if getattr(request.state, "log", None) is None:   # the log line says what was wrong
            request.state.log = f"{e.code or e.type}: {e.message}"
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found" if e.status_code == 404 else "method_not_allowed" if e.status_code == 405 else None
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(APIError(e.status_code, message, code=kind).body(), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        srv.ready()
        srv.check_open()
        return {"status": "ok"}

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    @app.api_route("/models", methods=["GET", "HEAD"])
    async def models():
        srv.ready()
        # No path: where the model lives on the server is nobody's business outside it.
        meta = {"n_ctx": srv.n_ctx, "n_vocab": srv.tok.n_vocab, "max_num_seqs": srv.max_num_seqs}
        return {"object": "list", "data": [{"id": srv.model_id, "object": "model", "created": 0,
                                            "owned_by": "ember", "meta": meta}]}

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request):
        srv.ready()
        req = await srv.cpu(_completion_request, await srv.body(request), srv.tok.n_vocab)
        prompts = await srv.cpu(_completion_prompts, srv.tok, req.prompts)
        return await srv.generate(request, req, prompts, chat=False)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request):
        srv.ready()
        req = await srv.cpu(_chat_request, await srv.body(request), srv.tok.n_vocab)
        reasoning = _reasoning(srv, req)
        text, prompt_ids = await srv.cpu(_chat_prompt, srv, req)
        await srv.cpu(_constrain_chat, srv, req, reasoning, text)
        parser = srv.tool_parser if req.tool_choice != "none" else None
        return await srv.generate(request, req, [(prompt_ids, text)], chat=True, tool_parser=parser,
                                  reasoning=reasoning)

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request):
        srv.ready()
        req = await srv.cpu(parse_embeddings, await srv.body(request), srv.tok.n_vocab)
        return await srv.embed(request, req)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        srv.ready()
        body = await srv.body(request)
        if client_routes.is_vllm_tokenize(body):
            return await srv.cpu(client_routes.vllm_tokenize, srv, body)
        return await srv.reply(_tokenize, srv.tok, body)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        srv.ready()
        return await srv.reply(_detokenize, srv.tok, await srv.body(request))

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics():
        stats = srv.engine.stats() if srv.engine is not None else None
        return PlainTextResponse(srv.metrics.render(stats), media_type="text/plain; version=0.0.4")

    @app.api_route("/", methods=["GET", "HEAD"])
    async def chat_page():
        return FileResponse(STATIC / "chat.html", media_type="text/html")

    client_routes.register(app, srv)   # /v1/models/{id}, /props, /version, /v1/responses, /v1/messages
    pooling_routes.register(app, srv)   # /v1/rerank and its aliases, /score
    return app


# ---- the CPU work of requests, run in the worker pool ----------------------------------------
_JSON_SLICE = 4096   # items of a long list encoded by one call
_CHUNK_CHARS = 1 << 20   # the body's chunks, each encoded and sent on its own


def _json_chunks(fn, *args) -> List[bytes]:
    """fn(*args) as Starlette's JSONResponse renders it, in chunks of about a MiB. Any one C call
    (an encoder call, a join, a copy) holds the GIL throughout and so stops the event loop: long
    lists go a slice at a time, and no call handles the whole of a large body."""
    pieces: List[str] = []
    _encode(fn(*args), pieces)
    chunks, group, size = [], [], 0
    for piece in pieces:
        group.append(piece)
        size += len(piece)
        if size >= _CHUNK_CHARS:
            chunks.append("".join(group).encode("utf-8"))
            group, size = [], 0
    chunks.append("".join(group).encode("utf-8"))
    return chunks


class _RawJSON:
    """JSON text already encoded, in parts, which _encode copies as they are."""

    def __init__(self, parts: List[str]):
        self.parts = parts


def _encode(value, out: list) -> None:
    if isinstance(value, _RawJSON):
        out.extend(value.parts)
    elif isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(("," if i else "") + json.dumps(str(key), ensure_ascii=False) + ":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list) and len(value) > _JSON_SLICE:
        out.append("[")
        for start in range(0, len(value), _JSON_SLICE):
            out.append(("," if start else "") + _dumps(value[start:start + _JSON_SLICE])[1:-1])
        out.append("]")
    else:
        out.append(_dumps(value))


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _completion_request(body: dict, n_vocab: int) -> GenerationRequest:
    req = parse_completion(body, n_vocab)
    c = constraints.parse_constraint(body)
    if c is not None:
        req.params.structured_outputs = constraints.direct(c)
    return req


def _chat_request(body: dict, n_vocab: int) -> GenerationRequest:
    req = parse_chat(body, n_vocab)
    req.constraint = constraints.parse_constraint(body)
    return req


def _reasoning(srv: _Server, req: GenerationRequest) -> ReasoningParser:
    """The request's reasoning parser: the server's, or its own reasoning_format (llama-server's)."""
    if req.reasoning_format is None:
        return srv.reasoning
    try:
        return ReasoningParser.for_template(srv.template.source, req.reasoning_format)
    except ValueError as e:
        raise bad_param("reasoning_format", str(e)) from None


def _constrain_chat(srv: _Server, req: GenerationRequest, reasoning: ReasoningParser, prompt: str) -> None:
    """Sets the reply's structured_outputs: the request's constraint, forced tool calls, lazily
    constrained ones and the thinking budget, after the thinking the prompt may open."""
    budget = req.thinking_budget if req.thinking_budget is not None else srv.settings.reasoning_budget
    tools = req.tools
    if req.tool_name is not None:
        tools = [t for t in tools if t["function"]["name"] == req.tool_name]
    cc = constraints.ChatConstraint(c=req.constraint, tools=tools if req.tool_choice != "none" else None,
                                    required=req.tool_choice == "required",   # a named tool: one call
                                    parallel=req.parallel_tool_calls and req.tool_name is None,
                                    budget=budget if budget >= 0 else None)
    req.params.structured_outputs = constraints.build_chat(cc, reasoning, prompt, srv.tool_parser.style,
                                                           srv.spell)


def _completion_prompts(tok, prompts) -> List[Tuple[List[int], str]]:
    out = []
    for prompt in prompts:
        try:
            ids = encode_prompt(tok, prompt)
        except (TypeError, ValueError) as e:
            raise APIError(400, str(e), param="prompt") from None
        text = prompt if isinstance(prompt, str) else bytes(tok.decode(ids, False)).decode("utf-8", errors="ignore")
        out.append((ids, text))
    return out


def _chat_prompt(srv: _Server, req: GenerationRequest) -> Tuple[str, List[int]]:
    try:
        text = srv.template.render(req.messages, tools=req.tools, **req.template_kwargs)
    except ChatTemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    except TemplateBudgetError as e:   # the request may be fine: the template is what runs away
        raise APIError(500, str(e), type="server_error", code="chat_template_budget") from None
    return text, list(srv.tok.encode(text.encode("utf-8"), srv.template.add_bos(text), True))


def _tokenize(tok, body: dict) -> dict:
    content = get(body, "content", "str", "")
    ids = list(tok.encode(content.encode("utf-8"), get(body, "add_special", "bool", False),
                          get(body, "parse_special", "bool", True)))
    if not get(body, "with_pieces", "bool", False):
        return {"tokens": ids}
    # Each distinct token's entry is encoded once, and the list is text: millions of small dicts
    # would cost seconds and, worse, garbage collections that stop every thread.
    encoded, parts = {}, []
    for start in range(0, len(ids), _JSON_SLICE):
        entries = []
        for t in ids[start:start + _JSON_SLICE]:
            entry = encoded.get(t)
            if entry is None:
                piece = bytes(tok.token_to_piece(t, True))
                try:   # llama-server's: the text where it is valid UTF-8, else the bytes
                    value = piece.decode("utf-8")
                except UnicodeDecodeError:
                    value = list(piece)
                entry = encoded[t] = _dumps({"id": t, "piece": value})
            entries.append(entry)
        parts.append(("," if start else "") + ",".join(entries))
    return {"tokens": _RawJSON(["[", *parts, "]"])}


def _detokenize(tok, body: dict) -> dict:
    tokens = get(body, "tokens", "list", [])
    n_vocab = tok.n_vocab
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens):
        raise APIError(400, f"'tokens' must be token ids in [0, {n_vocab})", param="tokens", code="invalid_value")
    return {"content": bytes(tok.decode(tokens, True)).decode("utf-8", errors="replace")}
