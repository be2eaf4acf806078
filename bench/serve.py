"""A plain threaded WSGI server for the approval-latency benchmark: `python bench/serve.py PORT`.

The real Django application (middleware, API auth, on_commit wake-up) over real HTTP,
without pulling in a production server the project does not depend on.
"""

from __future__ import annotations

import os
import pathlib
import sys
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


def main() -> None:
    from config.wsgi import application

    server = make_server("127.0.0.1", int(sys.argv[1]), application, ThreadingServer, QuietHandler)
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
