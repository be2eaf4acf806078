"""The gateway behind WSGI (`config.wsgi`, what gunicorn serves): each request is handed
to the ASGI application (`app.py`) on one event loop thread per process, and its answer
streamed back, SSE included. Two ways in: `application`, which `config.wsgi` sends
`/mcp/` to before Django's request handling (as `config.asgi` does), and
`gateway_view`, the same through Django's URLs (a server that hands every request to
Django, as the test suite's live server does).

Why a loop thread and not `asgiref.async_to_sync` per request: the SDK's request
handling lives in task groups that its session managers open once and keep (`run()`),
so they need one long-lived loop; a loop per request would start them per request.
The request's thread (one of gunicorn's threads) waits on a queue for the answer's parts;
nothing of a session lives in the loop between requests (app.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

log = logging.getLogger("airlock.gateway")

_loop: asyncio.AbstractEventLoop | None = None
_owner = 0  # the process that started `_loop`
_lock = threading.Lock()
# Headers the WSGI server sets itself (PEP 3333 forbids hop-by-hop ones from the app).
_SKIP = {"content-length", "connection", "keep-alive", "transfer-encoding"}


def loop() -> asyncio.AbstractEventLoop:
    """This process's gateway loop, started on first use (after a fork, too: a forked
    gunicorn worker gets its own; the parent's thread did not survive the fork)."""
    global _loop, _owner
    with _lock:
        if _loop is None or not _loop.is_running() or _owner != os.getpid():
            fresh = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(fresh)
                fresh.call_soon(started.set)
                fresh.run_until_complete(_forever())

            threading.Thread(target=run, name="airlock-gateway-loop", daemon=True).start()
            started.wait()
            _loop, _owner = fresh, os.getpid()
        return _loop


async def _forever() -> None:
    """What the gateway loop runs: a task that never ends, run to completion rather than
    `run_forever`. anyio takes the task its loop runs to completion as the root of its
    tree, and ends each thread of `anyio.to_thread` (the gateway's database threads,
    app.py's `db`) when that root ends. Under `run_forever` there was none, so each
    request's own task was the root: every request started a database thread and ended
    it with the request (a thread start, and a new thread's first connection, a call)."""
    await asyncio.Event().wait()


def _environ_scope(environ: dict[str, Any]) -> dict[str, Any]:
    """The ASGI scope of a WSGI request (PEP 3333's environ: a WSGI server's, or
    Django's `request.META`). The path is the one under the script prefix, as the
    gateway's routes are."""
    headers = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers.append((key[5:].replace("_", "-").lower().encode("latin-1"), str(value).encode("latin-1")))
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            headers.append((key.replace("_", "-").lower().encode("latin-1"), str(value).encode("latin-1")))
    server_name, server_port = str(environ.get("SERVER_NAME", "")), int(environ.get("SERVER_PORT") or 80)
    if "HTTP_HOST" not in environ:
        # PEP 3333's reconstruction; the app checks it against ALLOWED_HOSTS.
        headers.append((b"host", f"{server_name}:{server_port}".encode("latin-1")))
    path = environ.get("PATH_INFO", "") or "/"
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": environ.get("REQUEST_METHOD", "GET"),
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "path": path,
        "raw_path": path.encode("latin-1"),
        "query_string": environ.get("QUERY_STRING", "").encode("latin-1"),
        "root_path": environ.get("SCRIPT_NAME", ""),
        "headers": headers,
        "client": (environ.get("REMOTE_ADDR", ""), 0),
        "server": (server_name, server_port),
    }


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


@dataclass
class Answer:
    """The ASGI gateway's answer to one request, for a WSGI server: status, headers
    (without the hop-by-hop ones PEP 3333 forbids), and the whole body or a stream
    whose end (or closing) tells the app that the client went away."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""
    stream: Iterator[bytes] | None = None


def answer(scope: dict[str, Any], body: bytes) -> Answer:
    """Run the ASGI gateway for one request on this process's loop and wait for its answer.

    1. Start the ASGI call on the loop with the body already read.
    2. Wait for the answer's start (status, headers), then its first body part.
    3. A whole answer is returned as bytes; a stream (SSE) as an iterator that takes
       the parts as the loop sends them. Closing it (the client went away, or the
       stream ended) tells the ASGI app the client disconnected.
    """
    # Late: the gateway's app (the MCP SDK's server) loads on the first /mcp/ request,
    # not in every web process that imports this bridge through config.wsgi.
    from .app import application

    events: queue.Queue[dict[str, Any] | BaseException | None] = queue.Queue()
    target = loop()
    gone = asyncio.Event()  # bound to `target` on first await there
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(event: dict[str, Any]) -> None:
        events.put(event)

    async def call() -> None:
        try:
            await application(scope, receive, send)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            events.put(exc)
            raise
        finally:
            events.put(None)

    asyncio.run_coroutine_threadsafe(call(), target)

    def disconnect() -> None:
        target.call_soon_threadsafe(gone.set)

    start = events.get()
    if not isinstance(start, dict) or start["type"] != "http.response.start":
        disconnect()
        if isinstance(start, BaseException):
            log.error("the MCP gateway failed before answering", exc_info=start)
        failed = json.dumps({"error": "gateway_error", "detail": "the gateway could not answer"}).encode()
        return Answer(503, [("Content-Type", "application/json")], failed)
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
    headers = [(k, v) for k, v in headers if k.lower() not in _SKIP]
    first = events.get()
    chunk = first.get("body", b"") if isinstance(first, dict) else b""
    if isinstance(first, dict) and not first.get("more_body"):
        disconnect()
        return Answer(start["status"], headers, chunk)

    def stream() -> Iterator[bytes]:
        try:
            if chunk:
                yield chunk
            while True:
                event = events.get()
                if not isinstance(event, dict):
                    return
                if event.get("body"):
                    yield event["body"]
                if not event.get("more_body"):
                    return
        finally:
            disconnect()

    return Answer(start["status"], headers, stream=stream())


def application(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """`/mcp/` as `config.wsgi` serves it: straight to the gateway, before Django's
    request handling, as `config.asgi` does (the gateway checks the Host, the token
    and the body's size itself; no session, cookie or CSRF token means anything to
    it). The body is read up to one byte past the gateway's limit, which refuses it."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    from .app import MAX_BODY  # late, as in answer(): the app loads on the first /mcp/ request

    limit = MAX_BODY + 1
    stream = environ["wsgi.input"]
    if length:
        body = stream.read(min(length, limit))
    elif environ.get("wsgi.input_terminated"):  # a chunked body (gunicorn says when it may be read to its end)
        body = stream.read(limit)
    else:
        body = b""
    found = answer(_environ_scope(environ), body)
    if found.stream is not None:
        start_response(f"{found.status} {_phrase(found.status)}", found.headers)
        return found.stream
    start_response(f"{found.status} {_phrase(found.status)}",
                   [*found.headers, ("Content-Length", str(len(found.body)))])
    return [found.body]


@csrf_exempt  # a bearer token authenticates, never a cookie
def gateway_view(request: HttpRequest, profile: str) -> HttpResponse:
    """/mcp/<profile>/ through Django's URLs: what a server that hands every request
    to Django answers it with (the test suite's live server; `config.wsgi` sends
    `/mcp/` to `application` above instead)."""
    found = answer(_environ_scope(request.META), request.body)
    response: HttpResponse
    if found.stream is not None:
        response = StreamingHttpResponse(found.stream, status=found.status)
    else:
        response = HttpResponse(found.body, status=found.status)
    for key, value in found.headers:
        response[key] = value
    # The gateway logged its own refusal (app.py): DenialLogMiddleware need not again.
    response.denial_logged = True  # type: ignore[attr-defined]
    return response
