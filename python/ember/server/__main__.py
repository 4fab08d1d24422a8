"""`ember-server` / `python -m ember.server`: parse the flags, start listening, load the model
in the background (/health answers 503 meanwhile), serve until Ctrl-C or SIGTERM."""
from __future__ import annotations

import logging
import sys
from typing import List, Optional

from ..cli import run_tool
from .args import parse_args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return run_tool("ember-server", lambda: _serve(args))


def _serve(args) -> int:
    # Imported here: `ember-server --help` does not wait for the web stack to load.
    import uvicorn

    from .app import create_app

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    server = None

    def stop(_error):
        server.should_exit = True

    app = create_app(args, on_load_failed=stop)
    # uvicorn's access log is off: the app logs one line per request with its tokens and timings.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, access_log=False,
                                           log_level="info", timeout_graceful_shutdown=5))
    server.run()
    error = app.state.server.load_error
    if error is not None:
        raise error
    return 0


if __name__ == "__main__":
    sys.exit(main())
