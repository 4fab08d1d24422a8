"""ember-server on uvicorn: a connection limit, a deadline on reading each request (--timeout:
slow headers and idle new connections are closed; a slow body gets the app's 408), and the
graceful drain on SIGTERM / Ctrl-C (--shutdown-timeout), where a second signal exits at once."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("ember.server")

DRAIN_GRACE_S = 5.0   # after the shutdown timeout: time for aborted streams to send their last chunks
_BUSY_BODY = (b'{"error": {"message": "too many open connections", "type": "unavailable_error", "param": null, '
              b'"code": "too_many_connections"}}')
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a read deadline: armed when a connection opens and after each
    response, disarmed once a request has arrived in full (its body being read, the app's own
    --timeout answers). Past max_connections, a new connection gets a 503 and is closed."""
    read_timeout: float = 600.0
    max_connections: int = 1024

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._deadline: Optional[asyncio.TimerHandle] = None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A response goes out as two writes (head, body): with Nagle's algorithm the body waits
            # for the client's delayed ACK of the head, 40 ms of every keep-alive request.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.connections) > self.max_connections:
            transport.write(BUSY)
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return   # the app has the request: it answers a late body itself
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:   # the request line and headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)


class EmberServer(uvicorn.Server):
    """uvicorn's server whose shutdown drains the app first (create_app's _Server.drain)."""

    def __init__(self, config: uvicorn.Config, shutdown_timeout: float):
        super().__init__(config)
        self.shutdown_timeout = shutdown_timeout

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit:   # a second signal: the operator does not want to wait
            log.warning("second signal (%s): exiting now", signal.Signals(sig).name)
            os._exit(128 + sig)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        self.config.app.state.server.drain(self.shutdown_timeout)
        await super().shutdown(sockets)


def make_server(app, host: str = "127.0.0.1", port: int = 8080, timeout: float = 600.0,
                shutdown_timeout: float = 10.0, max_connections: int = 1024,
                log_level: str = "info") -> EmberServer:
    """The uvicorn server of app (create_app's). uvicorn's access log is off: the app logs one line
    per request with its tokens and timings."""
    protocol = type("EmberProtocol", (_Protocol,), {"read_timeout": timeout, "max_connections": max_connections})
    config = uvicorn.Config(app, host=host, port=port, http=protocol, access_log=False, log_level=log_level,
                            timeout_keep_alive=min(5, timeout),
                            timeout_graceful_shutdown=shutdown_timeout + DRAIN_GRACE_S)
    return EmberServer(config, shutdown_timeout)
