"""The API's refusals: every one is `{"error": code, "detail": ...}` with its status, never HTML."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from agents import access
from agents.actions.base import ActionError
from agents.lib.jsonsafe import JsonError
from agents.ops.middleware import denied
from agents.ops.unavailable import unavailable

log = logging.getLogger("airlock.api")

ERRORS = frozenset({400, 401, 403, 404, 409, 413})


def error(status: int, code: str, detail: Any, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


class _PlainEncoder(DjangoJSONEncoder):
    """Times as every other answer of the API has them (ISO 8601, DjangoJSONEncoder's
    form, which ninja's renderer uses too); anything else unknown as its text."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(o)


def plain(value: Any) -> Any:
    # Validation errors can carry exceptions and other objects in their context; a
    # conflict carries an approval's to_dict(), with its datetimes.
    return json.loads(json.dumps(value, cls=_PlainEncoder))


def forbidden(detail: str) -> ActionError:
    return ActionError("forbidden", detail, status=403)


def _action_error(request: HttpRequest, exc: ActionError) -> HttpResponse:
    return error(exc.status, exc.code, exc.detail)


def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    detail = exc.message if exc.message != "Unauthorized" else "log in or send 'Authorization: Bearer <token>'"
    return error(401, "unauthenticated", detail, WWW_Authenticate='Bearer realm="airlock"')


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    codes = {400: "invalid_json", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 429: "throttled"}
    # A body the parser refused: its message names the problem ("1e400 at $.x is not a
    # finite number") where ninja says only "Cannot parse request body".
    cause = exc.__cause__
    detail = cause.message if isinstance(cause, JsonError) else exc.message
    return error(exc.status_code, codes.get(exc.status_code, "bad_request"), detail)


def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors]
    return error(400, "invalid_request", plain(errors))


def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    if isinstance(exc, access.RunHidden):
        denied(request, "another user's run")
    return error(404, "not_found", str(exc) or "no such object")


def _suspicious(request: HttpRequest, exc: SuspiciousOperation) -> HttpResponse:
    # Django turns these into a 400 page; ninja's catch-all would make them a 500.
    if isinstance(exc, RequestDataTooBig):
        return error(413, "too_large", f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
    return error(400, "bad_request", "the request was refused as malformed")


def _database_down(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A restart or failover, not a bug: a JSON 503 the client may retry.
    return unavailable(request, exc)


def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A bug, not a client error: log it with its traceback and still answer in JSON.
    log.exception("api error on %s %s", request.method, request.path)
    return error(500, "server_error", "an unexpected error; it has been logged")


def register(api: NinjaAPI) -> None:
    """Install the handlers; ninja looks them up along the exception's MRO, most specific first."""
    api.add_exception_handler(ActionError, _action_error)
    api.add_exception_handler(AuthenticationError, _unauthenticated)
    api.add_exception_handler(HttpError, _http_error)
    api.add_exception_handler(ValidationError, _invalid)
    api.add_exception_handler(Http404, _not_found)
    api.add_exception_handler(SuspiciousOperation, _suspicious)
    api.add_exception_handler(OperationalError, _database_down)
    api.add_exception_handler(InterfaceError, _database_down)
    api.add_exception_handler(Exception, _unexpected)
