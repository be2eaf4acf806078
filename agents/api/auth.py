"""Who is calling: a bearer token or the browser's session (with CSRF), and the strict JSON parser."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from ninja.errors import AuthenticationError, HttpError
from ninja.parser import Parser
from ninja.security import HttpBearer
from ninja.security.apikey import APIKeyCookie
from ninja.utils import check_csrf

from agents.actions import tokens
from agents.api.errors import error
from agents.lib import jsonsafe

SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


class TokenAuth(HttpBearer):
    """`Authorization: Bearer <token>`. A present but wrong header is a 401 at once: it
    never falls back to the session, so a script with a revoked token fails loudly.

    `ahead`: for an operation whose first read does not depend on who asks (a run by
    its id), that read's statement for this request (None: none); the token's own
    statement reads it too (`tokens.token_user_and`) and its rows are left on the
    request as `airlock_read`, for the view to judge (the token's user is not yet known
    when it is read)."""

    def __init__(self, ahead: Callable[[HttpRequest], tuple[str, list[Any]] | None] | None = None) -> None:
        super().__init__()
        self.ahead = ahead

    def __call__(self, request: HttpRequest) -> Any:
        header = request.headers.get("Authorization")
        if header is None:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise AuthenticationError(401, "the Authorization header must be 'Bearer <token>'")
        user = self.authenticate(request, raw.strip())
        if user is None:
            # Never log or echo the token itself.
            raise AuthenticationError(401, "unknown or revoked API token")
        return user

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        read = self.ahead(request) if self.ahead is not None else None
        if read is None:
            return tokens.token_user(token)
        user, request.airlock_read = tokens.token_user_and(token, read)  # type: ignore[attr-defined]
        return user


class SessionAuth(APIKeyCookie):
    """The browser's login session; a POST must carry the CSRF token like any form."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self) -> None:
        # csrf=True tells the Swagger page to send the token; the check itself is below.
        super().__init__(csrf=True)

    def __call__(self, request: HttpRequest) -> Any:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not user.is_active:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise HttpError(403, "CSRF check failed: send the csrftoken cookie's value in X-CSRFToken")
        return user

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return None  # unused: __call__ reads the session Django already loaded


class StrictJsonParser(Parser):
    """Bodies through `agents.lib.jsonsafe`: no NaN, Infinity or 1e400, no lone surrogates,
    bounded depth and size (PostgreSQL's jsonb and pydantic's serializer refuse what
    json.loads lets through, and a request must not turn that into a 500). Ninja wraps
    the JsonError in a 400; `errors._http_error` passes its message on."""

    def parse_body(self, request: HttpRequest) -> Any:
        return jsonsafe.parse(request.body)


def docs_access(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The schema and the browsable docs need a logged-in user (session or token)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            user = TokenAuth()(request) or SessionAuth()(request)
        except HttpError as exc:
            return error(exc.status_code, "unauthenticated", str(exc))
        if user is None:
            if request.path.endswith(".json"):
                return error(401, "unauthenticated", "log in or send 'Authorization: Bearer <token>'")
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapper
