"""The gateway behind WSGI (`config.wsgi`, what gunicorn serves): a Django view that hands
each request to the ASGI application (`app.py`) on one event loop thread per process,
and streams its answer back, SSE included.

Why a loop thread and not `asgiref.async_to_sync` per request: the SDK's request
handling lives in task groups that its session managers open once and keep (`run()`),
so they need one long-lived loop; a loop per request would start them per request.
The view's thread (one of gunicorn's threads) waits on a queue for the answer's parts;
nothing of a session lives in the loop between requests (app.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
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
                fresh.run_forever()

            threading.Thread(target=run, name="airlock-gateway-loop", daemon=True).start()
            started.wait()
            _loop, _owner = fresh, os.getpid()
        return _loop


def _scope(request: HttpRequest) -> dict[str, Any]:
    meta = request.META
    headers = []
    for key, value in meta.items():
        if key.startswith("HTTP_"):
            headers.append((key[5:].replace("_", "-").lower().encode("latin-1"), str(value).encode("latin-1")))
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            headers.append((key.replace("_", "-").lower().encode("latin-1"), str(value).encode("latin-1")))
    if "HTTP_HOST" not in meta:
        # Django validated the host it answers for (ALLOWED_HOSTS); the app checks it again.
        headers.append((b"host", request.get_host().encode("latin-1")))
    server_port = int(meta.get("SERVER_PORT") or 80)
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": meta.get("QUERY_STRING", "").encode("latin-1"),
        "root_path": "",
        "headers": headers,
        "client": (meta.get("REMOTE_ADDR", ""), 0),
        "server": (meta.get("SERVER_NAME", ""), server_port),
    }


@csrf_exempt  # a bearer token authenticates, never a cookie
def gateway_view(request: HttpRequest, profile: str) -> HttpResponse:
    """/mcp/<profile>/ under WSGI: the ASGI gateway's answer, as a Django response.

    1. Read the body here (Django's limits apply) and start the ASGI call on the loop.
    2. Wait for the answer's start (status, headers), then its first body part.
    3. A whole answer is an HttpResponse; a stream (SSE) a StreamingHttpResponse
       whose iterator takes the parts as the loop sends them. Closing it (the client
       went away, or the stream ended) tells the ASGI app the client disconnected.
    """
    from .app import application

    body = request.body
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
            await application(_scope(request), receive, send)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting view
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
        return JsonResponse({"error": "gateway_error", "detail": "the gateway could not answer"}, status=503)
    head = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
    first = events.get()
    chunk = first.get("body", b"") if isinstance(first, dict) else b""
    if isinstance(first, dict) and not first.get("more_body"):
        disconnect()
        response: HttpResponse = HttpResponse(chunk, status=start["status"])
    else:

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

        response = StreamingHttpResponse(stream(), status=start["status"])
    for key, value in head:
        if key.lower() not in _SKIP:
            response[key] = value
    return response
