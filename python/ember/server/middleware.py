"""What every HTTP request passes through, as one ASGI middleware (not Starlette's
BaseHTTPMiddleware, which would stand between a streaming response and the client's disconnect):
the API key check and the one log line per request."""
from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Optional

from .openai_schema import APIError

log = logging.getLogger("ember.server")

# Open without a key, as in llama-server: load balancers probe /health, browsers load the page.
PUBLIC_PATHS = frozenset({"/", "/health"})


async def send_error(send, error: APIError) -> None:
    """Answers with error's JSON body, outside any framework."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """Checks `Authorization: Bearer KEY` (api_key None: no check) and logs each request once it
    ends: client, method, path, status (499: the client left first), time, and what the handler
    put in request.state.log."""

    def __init__(self, app, api_key: Optional[str]):
        self.app = app
        self._key = api_key.encode() if api_key else None

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 499
        scope.setdefault("state", {})

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self._key is not None and scope["path"] not in PUBLIC_PATHS and not self._authorized(scope):
                await send_error(send_and_note, APIError(
                    401, "a valid API key is required: send the header `Authorization: Bearer KEY`",
                    type="invalid_request_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}))
            else:
                await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client") or ("-", 0)
            extra = scope["state"].get("log")
            log.info("%s \"%s %s\" %d %.1f ms%s", client[0], scope["method"], scope["path"], status,
                     (time.perf_counter() - start) * 1e3, f" {extra}" if extra else "")
