"""The JSON API under /api/: launch, read, cancel runs; list and decide approvals.

Every endpoint is a thin shell: authenticate (`auth`: session with CSRF, or a bearer
token), check the role with `agents.access`, call one action from `agents.actions`,
render JSON (`schemas`). Every refusal is `{"error": code, "detail": ...}` with a 4xx
status, never HTML (`errors`). The endpoints live in `runs`, `approvals` and
`external` (the decision API of external agents).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import URLPattern, re_path
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.operation import Operation

from agents.api import approvals, errors, external, runs
from agents.api.auth import SessionAuth, StrictJsonParser, TokenAuth, docs_access


class AirlockAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        # The ids clients generated code from were named after the single module the
        # API began as (agents_api_runs_create): the package split keeps them.
        return f"agents_api_{operation.view_func.__name__}"


api = AirlockAPI(
    title="Airlock API",
    version="1",
    description="Launch agent runs, follow them, cancel them, and decide their pending tool calls.",
    auth=[TokenAuth(), SessionAuth()],
    parser=StrictJsonParser(),
    urls_namespace="api",
    docs_decorator=docs_access,
)
errors.register(api)
api.add_router("", runs.router)
api.add_router("", approvals.router)
api.add_router("", external.router)


def _json_405(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # django-ninja answers a wrong method with a plain-text 405; clients get JSON here.
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            return errors.error(
                405, "method_not_allowed", f"{request.method} is not allowed here", Allow=response["Allow"]
            )
        return response

    return wrapper


@csrf_exempt
def _unknown(request: HttpRequest, rest: str = "") -> HttpResponse:
    return errors.error(404, "not_found", f"no API endpoint at {request.path}")


def urlpatterns() -> list[URLPattern]:
    patterns, _app, _namespace = api.urls
    for p in patterns:
        if isinstance(p, URLPattern):
            p.callback = _json_405(p.callback)
    # [\s\S], not ".": a path with a newline in it (%0A) is an unknown API path too.
    return [*patterns, re_path(r"^(?P<rest>[\s\S]*)$", _unknown)]
