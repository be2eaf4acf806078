"""The JSON API under /api/: launch, read, cancel runs; list and decide approvals.

Every endpoint is a thin shell: authenticate (session with CSRF, or a bearer token),
check the role with `agents.access`, call one action from `agents.actions`, render JSON.
Every refusal is `{"error": code, "detail": ...}` with a 4xx status, never HTML.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.urls import URLPattern, re_path
from django.views.decorators.csrf import csrf_exempt
from ninja import Header, NinjaAPI, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer
from ninja.security.apikey import APIKeyCookie
from ninja.utils import check_csrf
from pydantic import ConfigDict, Field, StrictInt, StrictStr

from agents import access, actions, tokens
from agents.actions import ActionError
from agents.engine import decisions
from agents.middleware import denied
from agents.models import Approval, IdempotencyKey, Run
from agents.models import Transition as TransitionRow

log = logging.getLogger("airlock.api")

MAX_ID = access.MAX_ID
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


# -- authentication ------------------------------------------------------------------


class TokenAuth(HttpBearer):
    """`Authorization: Bearer <token>`. A present but wrong header is a 401 at once: it
    never falls back to the session, so a script with a revoked token fails loudly."""

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
        return tokens.token_user(token)


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
    """JSON as RFC 8259 has it: NaN and Infinity are refused (PostgreSQL's jsonb refuses
    them too, and a request must not be able to turn that into a 500)."""

    def parse_body(self, request: HttpRequest) -> Any:
        def refuse(name: str) -> Any:
            raise ValueError(f"{name} is not JSON")

        return json.loads(request.body, parse_constant=refuse)


def _docs_access(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The schema and the browsable docs need a logged-in user (session or token)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            user = TokenAuth()(request) or SessionAuth()(request)
        except HttpError as exc:
            return _error(exc.status_code, "unauthenticated", str(exc))
        if user is None:
            if request.path.endswith(".json"):
                return _error(401, "unauthenticated", "log in or send 'Authorization: Bearer <token>'")
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapper


api = NinjaAPI(
    title="Airlock API",
    version="1",
    description="Launch agent runs, follow them, cancel them, and decide their pending tool calls.",
    auth=[TokenAuth(), SessionAuth()],
    parser=StrictJsonParser(),
    urls_namespace="api",
    docs_decorator=_docs_access,
)


# -- errors --------------------------------------------------------------------------


def _error(status: int, code: str, detail: Any, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _plain(value: Any) -> Any:
    # Validation errors can carry exceptions and other objects in their context.
    return json.loads(json.dumps(value, default=str))


@api.exception_handler(ActionError)
def _action_error(request: HttpRequest, exc: ActionError) -> HttpResponse:
    return _error(exc.status, exc.code, exc.detail)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    detail = exc.message if exc.message != "Unauthorized" else "log in or send 'Authorization: Bearer <token>'"
    return _error(401, "unauthenticated", detail, WWW_Authenticate='Bearer realm="airlock"')


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    codes = {400: "invalid_json", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 429: "throttled"}
    return _error(exc.status_code, codes.get(exc.status_code, "bad_request"), exc.message)


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors]
    return _error(400, "invalid_request", _plain(errors))


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    if isinstance(exc, access.RunHidden):
        denied(request, "another user's run")
    return _error(404, "not_found", str(exc) or "no such object")


@api.exception_handler(SuspiciousOperation)
def _suspicious(request: HttpRequest, exc: SuspiciousOperation) -> HttpResponse:
    # Django turns these into a 400 page; ninja's catch-all would make them a 500.
    if isinstance(exc, RequestDataTooBig):
        return _error(413, "too_large", f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
    return _error(400, "bad_request", "the request was refused as malformed")


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def _database_down(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A restart or failover, not a bug: a JSON 503 the client may retry.
    from agents.unavailable import unavailable

    return unavailable(request, exc)


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A bug, not a client error: log it with its traceback and still answer in JSON.
    log.exception("api error on %s %s", request.method, request.path)
    return _error(500, "server_error", "an unexpected error; it has been logged")


def _forbidden(detail: str) -> ActionError:
    return ActionError("forbidden", detail, status=403)


# -- shapes --------------------------------------------------------------------------


class Error(Schema):
    error: str
    detail: Any = None


class Limits(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_steps: StrictInt | None = Field(None, ge=1)
    max_cost_micros: StrictInt | None = Field(None, ge=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    deadline_seconds: StrictInt | None = Field(None, ge=1)
    max_consecutive_errors: StrictInt | None = Field(None, ge=1)
    max_identical_calls: StrictInt | None = Field(None, ge=1)


class RunIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    agent: StrictStr = Field(
        ..., min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$", description="an agent profile's name"
    )
    task: StrictStr = Field(..., max_length=100_000)
    limits: Limits | None = Field(None, description="each may only tighten the profile's")
    approver: Literal["human", "none"] = "human"
    script: list[dict[str, Any]] | None = Field(None, description="decisions for the scripted agent")
    # Any: the engine's validator checks it and names the bad field in a 400 invalid_policy.
    policy: Any = Field(
        None,
        description='tightens the profile\'s policy for this run: {"rules": [ask/deny rules], '
        '"irreversible_approvals": N, "separate_duties": true, "approval_timeout_seconds": N} (docs/policy.md)',
    )


class DecisionIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    decision: decisions.DecisionName = Field(
        ..., description="approve or reject; an 'outcome unknown' approval takes happened, retry or fail"
    )
    note: StrictStr = Field("", max_length=10_000)
    args: dict[str, Any] | None = Field(
        None, description="with approve: run the call with these arguments instead (checked like the model's)"
    )
    remember: Literal["call", "tool"] | None = Field(
        None, description="with approve: allow the same call (call) or any call of the tool (tool) for the rest of the run"
    )


class VoteOut(Schema):
    by: str
    decision: str
    note: str
    at: dt.datetime


class ApprovalOut(Schema):
    id: int
    run: int
    status: str
    kind: str
    tool: str
    risk: str
    args: Any = None
    edited_args: Any = None
    reason: str
    taint_source: dict[str, Any] | None = None
    rule: dict[str, Any] | None = None
    required: int
    votes: list[VoteOut]
    decided_by: str | None = None
    decided_at: dt.datetime | None = None
    note: str
    expires_at: dt.datetime | None = None
    created_at: dt.datetime


class GrantOut(Schema):
    id: int
    tool: str
    args: Any = None
    by: str | None = None
    created_at: dt.datetime
    revoked_at: dt.datetime | None = None


class RunOut(Schema):
    id: int
    agent: str
    state: str
    task: str
    steps: int
    cost_micros: int
    tokens: int
    answer: str | None = None
    error: str | None = None
    tainted: bool
    created_at: dt.datetime
    updated_at: dt.datetime
    pending_approval: ApprovalOut | None = None
    grants: list[GrantOut] = []


class TransitionOut(Schema):
    seq: int
    from_state: str
    to_state: str
    kind: str
    payload: dict[str, Any]
    cost_micros: int
    tokens: int
    duration_ms: int
    actor: str
    created_at: dt.datetime


def approval_json(a: Approval) -> dict[str, Any]:
    return dict(a.to_dict())


def run_json(run: Run) -> dict[str, Any]:
    return dict(run.to_dict())


ERRORS = frozenset({400, 401, 403, 404, 409, 413})


# -- endpoints -----------------------------------------------------------------------


@api.post("/runs", response={200: RunOut, 201: RunOut, ERRORS: Error}, summary="Launch a run")
def runs_create(
    request: HttpRequest,
    payload: RunIn,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=200),
) -> Status[dict[str, Any]]:
    """Launch a run. With an `Idempotency-Key` header, repeating the same request returns
    the run it launched (200) instead of launching another; the same key with a
    different body is a 409."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_launch(user):
        raise _forbidden("launching runs needs the launcher role")
    body = payload.model_dump(exclude_unset=True, mode="json")
    limits = payload.limits.model_dump(exclude_none=True) if payload.limits else None
    launch = functools.partial(
        actions.run_launch,
        agent=payload.agent,
        task=payload.task,
        user=user,
        approver=payload.approver,
        limits=limits,
        script=payload.script,
        policy=payload.policy,
    )
    if not idempotency_key:
        return Status(201, run_json(launch()))
    body_hash = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    key = idempotency_key.replace("\x00", "")
    for _ in range(2):
        seen = IdempotencyKey.objects.select_related("run__profile").filter(user=user, key=key).first()
        if seen is not None:
            if seen.body_hash != body_hash:
                raise ActionError(
                    "idempotency_conflict", "this Idempotency-Key was used with a different body", status=409
                )
            return Status(200, run_json(seen.run))
        try:
            with transaction.atomic():
                run = launch()
                IdempotencyKey.objects.create(user=user, key=key, body_hash=body_hash, run=run)
            return Status(201, run_json(run))
        except IntegrityError:
            # A concurrent request with the same key won the insert; our run rolled back
            # with it (and its wake-up, which waits for the commit). Answer with theirs.
            continue
    raise ActionError("busy", "this Idempotency-Key is being used by a concurrent request; retry", status=409)


@api.get("/runs/{int:run_id}", response={200: RunOut, ERRORS: Error}, summary="A run")
def runs_detail(request: HttpRequest, run_id: int) -> dict[str, Any]:
    return run_json(access.readable_run(request.auth, run_id))  # type: ignore[attr-defined]


@api.get(
    "/runs/{int:run_id}/transitions", response={200: list[TransitionOut], ERRORS: Error}, summary="A run's transitions"
)
def runs_transitions(request: HttpRequest, run_id: int) -> list[TransitionRow]:
    run = access.readable_run(request.auth, run_id)  # type: ignore[attr-defined]
    return list(run.transitions.order_by("seq"))


@api.post("/runs/{int:run_id}/cancel", response={200: RunOut, ERRORS: Error}, summary="Cancel a run")
def runs_cancel(request: HttpRequest, run_id: int) -> dict[str, Any]:
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_cancel(user):
        raise _forbidden("cancelling runs needs the operator role")
    if not 0 < run_id <= MAX_ID:
        raise ActionError("not_found", f"no run {run_id}", status=404)
    run = actions.run_cancel(run_id=run_id, user=user, reason="through the API")
    return run_json(Run.objects.select_related("profile").get(pk=run.pk))


@api.post(
    "/runs/{int:run_id}/grants/{int:grant_id}/revoke", response={200: GrantOut, ERRORS: Error}, summary="Revoke a grant"
)
def runs_grant_revoke(request: HttpRequest, run_id: int, grant_id: int) -> dict[str, Any]:
    """End a run-scoped grant: the calls it covered ask again. Revoking twice answers
    with the grant as it is."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_decide(user):
        raise _forbidden("revoking grants needs the reviewer role")
    if not (0 < run_id <= MAX_ID and 0 < grant_id <= MAX_ID):
        raise ActionError("not_found", f"run {run_id} has no grant {grant_id}", status=404)
    return actions.grant_revoke(run_id=run_id, grant_id=grant_id, user=user).to_dict()


@api.get("/approvals", response={200: list[ApprovalOut], ERRORS: Error}, summary="Approvals, oldest first")
def approvals_list(
    request: HttpRequest,
    status: decisions.StatusName | None = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 100,
) -> list[dict[str, Any]]:
    """Approvals of the runs the caller may read, oldest first (the queue's order)."""
    user = request.auth  # type: ignore[attr-defined]
    if not (access.reads_all_runs(user) or access.can_launch(user)):
        raise _forbidden("reading approvals needs the reviewer, operator or launcher role")
    approvals = access.visible_approvals(user).select_related("decided_by").prefetch_related("votes")
    if status:
        approvals = approvals.filter(status=status)
    return [approval_json(a) for a in approvals.order_by("created_at", "pk")[:limit]]


@api.post(
    "/approvals/{int:approval_id}/decision", response={200: ApprovalOut, ERRORS: Error}, summary="Decide an approval"
)
def approvals_decide(request: HttpRequest, approval_id: int, payload: DecisionIn) -> dict[str, Any]:
    """The answer that decides wins. Repeating it (a retry, a second reviewer agreeing)
    returns the recorded decision unchanged; a contradicting answer is a 409 naming who
    decided. An approval that needs several votes answers with the votes so far; a
    reviewer voting again gets their vote back (a 409 if they now answer otherwise)."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_decide(user):
        raise _forbidden("deciding approvals needs the reviewer role")
    if not 0 < approval_id <= MAX_ID:
        raise ActionError("not_found", f"no approval {approval_id}", status=404)
    result = actions.approval_decide(
        approval_id=approval_id, user=user, decision=payload.decision, note=payload.note, args=payload.args,
        remember=payload.remember,
    )
    approval = result.approval
    if result.outcome == "late" and approval.decision != payload.decision:
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        recorded = approval.decision or approval.status
        raise ActionError(
            "already_decided",
            {
                "message": f"already {approval.status} ({recorded}) by {who}",
                "approval": _plain(approval_json(approval)),
            },
            status=409,
        )
    if result.outcome == "already_voted":
        mine = next((v for v in approval.current_votes() if v.by_id == user.pk), None)
        if mine is not None and mine.decision != payload.decision:
            raise ActionError(
                "already_voted",
                {"message": f"you already voted {mine.decision}", "approval": _plain(approval_json(approval))},
                status=409,
            )
    return approval_json(approval)


# -- urls ----------------------------------------------------------------------------


def _json_405(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # django-ninja answers a wrong method with a plain-text 405; clients get JSON here.
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            return _error(405, "method_not_allowed", f"{request.method} is not allowed here", Allow=response["Allow"])
        return response

    return wrapper


@csrf_exempt
def _unknown(request: HttpRequest, rest: str = "") -> HttpResponse:
    return _error(404, "not_found", f"no API endpoint at {request.path}")


def urlpatterns() -> list[URLPattern]:
    patterns, _app, _namespace = api.urls
    for p in patterns:
        if isinstance(p, URLPattern):
            p.callback = _json_405(p.callback)
    return [*patterns, re_path(r"^(?P<rest>.*)$", _unknown)]
