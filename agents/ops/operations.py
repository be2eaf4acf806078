"""Health, readiness and metrics for load balancers and Prometheus: `/healthz`,
`/readyz`, `/metrics`.

A middleware answers these three paths first, before sessions, CSRF, the login pages
and the host check, so a probe costs no session lookup and a load balancer may ask by
IP address. Nothing else is exempt from login. No answer names a host, a port, a URL or
a version: a failed readiness check says only which check failed.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agents.ops.metrics import REGISTRY
from agents.ops.unavailable import DATABASE_DOWN, unavailable

log = logging.getLogger("airlock.operations")

_migrated = False  # once every migration is applied it stays so until the next deploy


def healthz(request: HttpRequest) -> HttpResponse:
    """The process answers; nothing else is asked (no database)."""
    return JsonResponse({"status": "ok"})


def _database() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DATABASE_DOWN:
        return False


def _migrations() -> bool:
    global _migrated
    if not _migrated:
        # Reads the migration files once; cached after the first pass, so it stays cheap.
        executor = MigrationExecutor(connection)
        _migrated = not executor.migration_plan(executor.loader.graph.leaf_nodes())
    return _migrated


def _broker() -> bool:
    if not settings.REDIS_URL:
        return True  # the embedded filesystem broker is part of this host
    # Late: redis-py loads the OpenTelemetry SDK on import, and a process that does not
    # trace must not pay for it (tests/operations/test_traces.py).
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: the database answers, every migration is applied, the broker (when
    one is configured) answers; otherwise 503 naming the checks that failed."""
    failed = []
    if not _database():
        failed.append("database")
    else:
        try:
            if not _migrations():
                failed.append("migrations")
        except DATABASE_DOWN:
            failed.append("database")
    if not _broker():
        failed.append("broker")
    if failed:
        log.warning("not ready: %s", ", ".join(failed))
        return JsonResponse({"status": "unavailable", "failed": failed}, status=503)
    return JsonResponse({"status": "ready"})


def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus text format, for a bearer of AIRLOCK_METRICS_TOKEN (404 without one)."""
    expected = settings.AIRLOCK_METRICS_TOKEN
    if not expected:
        return HttpResponse("Not Found\n", status=404, content_type="text/plain")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        response = HttpResponse("401 Unauthorized: a bearer token is required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        log.warning("denied status=401 method=%s path=/metrics", request.method)
        return response
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        log.warning("denied status=403 method=%s path=/metrics", request.method)
        return HttpResponse("403 Forbidden: wrong token\n", status=403, content_type="text/plain")
    try:
        body = generate_latest(REGISTRY)
    except DATABASE_DOWN as exc:
        return unavailable(request, exc)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


PATHS: dict[str, Callable[[HttpRequest], HttpResponse]] = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


class OperationsMiddleware:
    """Answers the three operational paths (GET or HEAD) before any other middleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        view = PATHS.get(request.path)
        if view is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response = HttpResponse("405 Method Not Allowed\n", status=405, content_type="text/plain")
            response["Allow"] = "GET, HEAD"
            return response
        response = view(request)
        response["Cache-Control"] = "no-store"
        return response
