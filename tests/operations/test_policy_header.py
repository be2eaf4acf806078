"""The Content-Security-Policy header with its text kept (agents/ops/policy_header.py):
the text django-csp builds, on every response that takes the settings' policy as it
is, and django-csp's own answer for every response that changes it."""

from __future__ import annotations

from typing import Any

import pytest
from csp.middleware import CSPMiddleware as LibraryCSPMiddleware
from django.http import HttpResponse
from django.test import RequestFactory

from agents.ops.policy_header import CSPMiddleware

POLICY = {"DIRECTIVES": {"default-src": ["'self'"], "script-src": ["'self'", "cdn.example"]}}


def answered(middleware: type, *, nonce: bool = False, **marks: Any) -> tuple[str | None, Any]:
    """The header `middleware` puts on a plain response (with `marks` set on it, as
    django-csp's decorators do), and the request it answered."""
    request = RequestFactory().get("/api/runs/1")
    kept = middleware(lambda r: HttpResponse("{}"))
    kept.process_request(request)
    if nonce:
        str(request.csp_nonce)  # a template asked for the nonce
    response = HttpResponse("{}")
    for name, value in marks.items():
        setattr(response, name, value)
    response = kept.process_response(request, response)
    return response.get("Content-Security-Policy"), request


@pytest.mark.parametrize("marks", [{}, {"nonce": True}, {"_csp_update": {"form-action": ["sso.example"]}},
                                   {"_csp_replace": {"script-src": ["'none'"]}}, {"_csp_config": {"default-src": []}},
                                   {"_csp_exempt": True}])
def test_the_header_is_django_csps_whatever_the_response_asks(settings, marks: dict[str, Any]) -> None:
    settings.CONTENT_SECURITY_POLICY = POLICY
    ours, request = answered(CSPMiddleware, **marks)
    theirs, their_request = answered(LibraryCSPMiddleware, **marks)
    if marks.get("nonce"):  # each request's own nonce
        ours = ours.replace(request._csp_nonce, "N") if ours else ours
        theirs = theirs.replace(their_request._csp_nonce, "N") if theirs else theirs
    assert ours == theirs
    if not marks:  # (django-csp orders the directives as a set iterates: by hash, per process)
        assert dict(part.split(" ", 1) for part in ours.split("; ")) == {
            "default-src": "'self'", "script-src": "'self' cdn.example"}


def test_a_changed_policy_is_built_again_and_a_late_nonce_still_fails(settings) -> None:
    settings.CONTENT_SECURITY_POLICY = POLICY
    middleware = CSPMiddleware(lambda r: HttpResponse())
    first = RequestFactory().get("/")
    middleware.process_request(first)
    assert "script-src 'self' cdn.example" in middleware.process_response(first, HttpResponse())["Content-Security-Policy"]
    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"default-src": ["'none'"]}}
    second = RequestFactory().get("/")
    middleware.process_request(second)
    assert middleware.process_response(second, HttpResponse())["Content-Security-Policy"] == "default-src 'none'"
    with pytest.raises(Exception, match="not available after the CSP header"):
        str(second.csp_nonce)
