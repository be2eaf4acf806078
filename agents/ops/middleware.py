"""One log line for every refused request, so a denial leaves a trace an operator can find.

Django's own `django.request` warning names only the path; this line adds who asked and
with which method. It never logs headers, tokens, query strings or bodies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from agents.access import RunHidden

log = logging.getLogger("airlock.access")


def _escaped(text: str) -> str:
    # A path is the visitor's text: a CR, LF or terminal escape in it must not start a
    # forged log line (Django escapes its own request log the same way).
    return text.encode("unicode_escape").decode("ascii")


def _who(request: HttpRequest) -> str:
    # The API authenticates bearer tokens itself and puts the user on `request.auth`.
    return who_of(getattr(request, "auth", None) or getattr(request, "user", None))


LOGIN_PAGES = (settings.LOGIN_URL, "/admin/login/")


def _login_redirect(request: HttpRequest, response: HttpResponse) -> bool:
    """Being sent to a login form (ours, or the admin's for a non-staff user) is a denial too."""
    if response.status_code != 302 or request.path in LOGIN_PAGES:
        return False
    target = str(response.get("Location", "")).split("?", 1)[0]
    return target in LOGIN_PAGES


class DenialLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if getattr(response, "denial_logged", False):
            return response  # the view logged its own (the MCP gateway: agents/gateway/app.py)
        if response.status_code in (401, 403) or _login_redirect(request, response):
            log_denial(response.status_code, str(request.method), request.path, _who(request))
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        # A page asked for a run that is not this user's: Django answers 404 as for a
        # missing run; the log says what it was. (The API logs it in its own handler.)
        if isinstance(exception, RunHidden):
            denied(request, "another user's run")


def log_denial(status: int, method: str, path: str, who: str) -> None:
    """The line of a refused request (401, 403, a login redirect); `who` as `_who`
    gives it (escaped), "anonymous" for nobody."""
    log.warning("denied status=%s method=%s path=%s user=%s", status, _escaped(method), _escaped(path), who)


def who_of(user: Any) -> str:
    """`user` as the log line names it: escaped, or "anonymous"."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "anonymous"
    return _escaped(str(user.get_username()))


def denied(request: HttpRequest, what: str) -> None:
    """For refusals answered as 404 (another user's run, pages and API alike): the
    same line, status 404."""
    log.warning(
        "denied status=404 method=%s path=%s user=%s (%s)",
        _escaped(str(request.method)),
        _escaped(request.path),
        _who(request),
        what,
    )
