"""`ember-server` / `python -m ember.server`: parse the flags, start listening, load the model
in the background (/health answers 503 meanwhile), serve until Ctrl-C or SIGTERM, then drain
(--shutdown-timeout; a second signal exits at once)."""
from __future__ import annotations

import logging
import os
import socket
import sys
from typing import List, Optional

from ..cli import run_tool
from .args import parse_args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return run_tool("ember-server", lambda: _serve(args))


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a taken port is then one error line and
    status 1, not a load interrupted by the web server's exit."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {os.strerror(e.errno) if e.errno else e}") from None


def _serve(args) -> int:
    sock = _listen(args.host, args.port)
    # Imported here: `ember-server --help` does not wait for the web stack to load.
    from .app import create_app
    from .serving import make_server

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    server = None

    def stop(_error):
        server.should_exit = True

    app = create_app(args, on_load_failed=stop)
    server = make_server(app, args.host, args.port, timeout=args.timeout, shutdown_timeout=args.shutdown_timeout,
                         max_connections=args.max_connections)
    server.run(sockets=[sock])
    error = app.state.server.load_error
    if error is not None:
        raise error
    return 0


if __name__ == "__main__":
    sys.exit(main())
