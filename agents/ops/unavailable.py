"""The database is down (a restart, a failover): answer 503, never a 500 page.

A request that meets an unreachable database gets a JSON 503 under /api/ (the API's
error shape) and a short plain-text 503 elsewhere, both with Retry-After. Nothing is
lost by answering so: every write is one transaction, and a connection that failed is
dropped at the end of the request (CONN_HEALTH_CHECKS checks the next one).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

log = logging.getLogger("airlock.unavailable")

DATABASE_DOWN = (OperationalError, InterfaceError)
RETRY_AFTER = "5"
DETAIL = "the database is unavailable; try again in a few seconds"


def unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    log.warning("database unavailable on %s %s: %s: %s", request.method, request.path, type(exc).__name__, exc)
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"error": "unavailable", "detail": DETAIL}, status=503)
    else:
        response = HttpResponse(f"503 Service Unavailable: {DETAIL}.\n", status=503, content_type="text/plain")
    response["Retry-After"] = RETRY_AFTER
    return response


class DatabaseUnavailableMiddleware:
    """Turns a view's OperationalError/InterfaceError into a 503 (see the module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, DATABASE_DOWN):
            return unavailable(request, exc)
        return None


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: a middleware (a session lookup, say) that met a dead database still
    answers 503; any other error gets Django's usual 500 page."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_DOWN):
        return unavailable(request, exc)
    return defaults.server_error(request)
