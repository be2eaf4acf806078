"""A plain threaded WSGI server for the approval-latency benchmark: `python bench/serve.py PORT`.

The real Django application (middleware, API auth, on_commit wake-up) over real HTTP,
without pulling in a production server the project does not depend on.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


def wsgi_call(app: Callable[..., Any], environ: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """`app` (a WSGI application) answering `environ`, completed with wsgiref's testing
    defaults: its status, its headers (lower-case names) and its whole body, closed."""
    from wsgiref.util import setup_testing_defaults

    setup_testing_defaults(environ)
    started: list[Any] = []
    parts = app(environ, lambda status, head, exc_info=None: started.append((status, head)))
    try:
        content = b"".join(parts)
    finally:
        getattr(parts, "close", lambda: None)()
    status, head = started[0]
    return int(status.split()[0]), {k.lower(): v for k, v in head}, content


def main() -> None:
    from config.wsgi import application

    server = make_server("127.0.0.1", int(sys.argv[1]), application, ThreadingServer, QuietHandler)
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
