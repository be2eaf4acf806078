"""The token API's door: Django's request handling without a browser's layers.

A request to /api/ that carries an Authorization header is answered by its token or
refused (agents/api/auth.py: a present header never falls back to the session), so the
middleware that serves only a browser (session cookie, CSRF, login, messages, htmx,
allauth, the project switcher, the login lockout, static files) does nothing for it but
cost time on every agent's call. `config.wsgi` and `config.asgi` hand such a request to
a handler built from `settings.TOKEN_API_MIDDLEWARE` instead: the same URLs, views,
signals (connections are checked and closed as for any request), error handlers,
database-down 503, security headers, host check, CSP and refusal log, in the same order.
The access log is the server's (gunicorn's, uvicorn's), before any of this.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler

API_PREFIX = "/api/"


def is_token_request(path: str, authorization: object) -> bool:
    """A request the token API answers: under /api/ with an Authorization header (any
    value: a malformed or unknown one is refused there, 401, never read as a session)."""
    return authorization is not None and path.startswith(API_PREFIX)


@contextmanager
def _middleware(names: list[str]) -> Iterator[None]:
    # Django's handler reads settings.MIDDLEWARE once, while it is built (at import,
    # before any request): it is swapped for that moment only.
    full = settings.MIDDLEWARE
    settings.MIDDLEWARE = names
    try:
        yield
    finally:
        settings.MIDDLEWARE = full


class TokenAPIWSGIHandler(WSGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        with _middleware(settings.TOKEN_API_MIDDLEWARE):
            super().load_middleware(is_async)


class TokenAPIASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        with _middleware(settings.TOKEN_API_MIDDLEWARE):
            super().load_middleware(is_async)
