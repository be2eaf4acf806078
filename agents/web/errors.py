"""The error pages: 400, 403, 404 and a refused CSRF token, in the site's layout, with
the reason the server already knows ("only launchers start runs") and a way back.

Under /api/ the same refusals stay JSON (`{"error", "detail"}`), as the rest of the API
answers (agents/api/errors.py); the API's own handlers answer first, these catch what
reaches Django's handlers from outside ninja.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme

TITLES = {
    400: ("Bad request", "bad_request", "The request could not be understood."),
    403: ("Not allowed", "forbidden", "You are not allowed to do this."),
    404: ("Not found", "not_found", "There is nothing here, or it is not yours to see."),
}

CSRF_REASON = (
    "The form you sent was out of date: its security token did not match this browser's "
    "session (the page may have been opened before you logged in again, or cookies are off). "
    "Go back, reload the page and send it again."
)


def _reason(exception: BaseException | None) -> str:
    """The message the view raised with, when it is a sentence meant for people (Django's
    own 404 carries a dict of tried URL patterns, which is not)."""
    if exception is None or not exception.args or not isinstance(exception.args[0], str):
        return ""
    return exception.args[0]


def _back(request: HttpRequest) -> str:
    """Where "Go back" leads: the page the visitor came from on this site, else the overview."""
    referer = request.META.get("HTTP_REFERER", "")
    if referer and referer != request.build_absolute_uri() and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return referer
    return "/"


def error_page(
    request: HttpRequest, status: int, reason: str, *, title: str = "", code: str = "", detail: str = ""
) -> HttpResponse:
    """The error page in the site's layout (JSON under /api/). `reason` is said in plain
    words; `title` and `code` default to the status's; `detail` is small print (and the
    API's detail when given)."""
    default_title, default_code, fallback = TITLES[status]
    if request.path.startswith("/api/"):
        return JsonResponse({"error": code or default_code, "detail": detail or reason or fallback}, status=status)
    context = {
        "status": status, "title": title or default_title, "reason": reason or fallback, "detail": detail,
        "back": _back(request),
    }
    return render(request, "error.html", context, status=status)


def bad_request(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    return error_page(request, 400, _reason(exception))


def permission_denied(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    return error_page(request, 403, _reason(exception))


def page_not_found(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    return error_page(request, 404, _reason(exception))


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: Django's reason ("CSRF token missing.") is for developers; the
    page says what happened in words, and keeps Django's reason in small print."""
    return error_page(request, 403, CSRF_REASON, title="Form expired", code="csrf_failed", detail=reason)
