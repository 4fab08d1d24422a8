"""What every HTTP request passes through, as one ASGI middleware (not Starlette's
BaseHTTPMiddleware, which would stand between a streaming response and the client's disconnect):
the API key check, CORS, the one log line per request, a JSON 500 for any failure (the
connection stays open) and the end of a response whose client stopped reading."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Optional, Sequence

from starlette.requests import ClientDisconnect

from .openai_schema import APIError

log = logging.getLogger("ember.server")

# Open without a key, as in llama-server: load balancers probe /health, browsers load the page.
PUBLIC_PATHS = frozenset({"/", "/health"})
CORS_METHODS = b"GET, HEAD, POST, OPTIONS"
CORS_HEADERS = b"Authorization, Content-Type, X-Api-Key"


class ClientStalled(Exception):
    """The client read nothing of the response for --timeout seconds."""


async def send_error(send, error: APIError) -> None:
    """Answers with error's JSON body, outside any framework."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> Optional[bytes]:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class Gate:
    """Checks `Authorization: Bearer KEY` or `x-api-key: KEY` (api_key None: no check), answers
    CORS for the origins allowed (none by default: browsers then keep other sites' pages from
    reading the API), and logs each request once it ends: client, method, path, status (499: the
    client left first), time, and what the handler put in request.state.log. A send that waits longer than
    send_timeout seconds for the client to read ends the response (and so its generation)."""

    def __init__(self, app, api_key: Optional[str], cors_origins: Sequence[str] = (),
                 send_timeout: Optional[float] = None):
        self.app = app
        self._key = api_key.encode() if api_key else None
        self._origins = frozenset(o.encode() for o in cors_origins)
        self._send_timeout = send_timeout

    def _authorized(self, scope) -> bool:
        value = _header(scope, b"authorization")
        if value is not None:
            scheme, _, token = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        value = _header(scope, b"x-api-key")   # Anthropic's clients send the key so
        return value is not None and hmac.compare_digest(value.strip(), self._key)

    def _cors(self, scope) -> list:
        origin = _header(scope, b"origin")
        if origin is None or not (origin in self._origins or b"*" in self._origins):
            return []
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 499
        scope.setdefault("state", {})
        cors = self._cors(scope)

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if cors:
                    message = dict(message, headers=[*message.get("headers", []), *cors])
            if self._send_timeout is None:
                return await send(message)
            try:
                async with asyncio.timeout(self._send_timeout):
                    await send(message)
            except TimeoutError:
                raise ClientStalled() from None

        outcome = None
        try:
            if cors and scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
                await send_and_note({"type": "http.response.start", "status": 204, "headers": [
                    (b"access-control-allow-methods", CORS_METHODS), (b"access-control-allow-headers", CORS_HEADERS),
                    (b"access-control-max-age", b"600")]})
                await send_and_note({"type": "http.response.body", "body": b""})
            elif self._key is not None and scope["path"] not in PUBLIC_PATHS and scope["method"] != "OPTIONS" \
                    and not self._authorized(scope):
                await send_error(send_and_note, APIError(
                    401, "a valid API key is required: send the header `Authorization: Bearer KEY`",
                    type="invalid_request_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}))
            else:
                await self.app(scope, receive, send_and_note)
        except ClientStalled:
            outcome = f"the client read nothing for {self._send_timeout:g} s: response ended"
        except ClientDisconnect:
            outcome = "the client left"
        except Exception as e:   # anything the app did not answer: a JSON 500, the details only in the log
            outcome = f"internal error: {type(e).__name__}: {e}"
            log.debug("%s %s failed", scope["method"], scope["path"], exc_info=True)
            if status == 499:
                status = 500
                await send_error(send, APIError(500, "internal server error (the server log has the details)",
                                                type="server_error", code="internal_error"))
        finally:
            client = scope.get("client") or ("-", 0)
            extra = scope["state"].get("log") or outcome
            failed = status == 500 or (outcome or "").startswith("internal")
            log.log(logging.ERROR if failed else logging.INFO, "%s \"%s %s\" %d %.1f ms%s", client[0],
                    scope["method"], scope["path"], status, (time.perf_counter() - start) * 1e3,
                    f" {extra}" if extra else "")
