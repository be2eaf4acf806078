"""/api/runs: launch, list, export, read, follow, cancel, hold, fork and retry runs, and revoke their grants."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Header, Query, Router, Status

from agents import access
from agents.actions import forks
from agents.actions.base import ActionError
from agents.actions.runs import grant_revoke, run_cancel, run_hold, run_launch, run_release
from agents.api.auth import SessionAuth, TokenAuth
from agents.api.errors import ERRORS, forbidden
from agents.api.listing import NEWEST_FIRST, RunExportQuery, RunPageQuery, page, run_filters, stream, wants_transitions
from agents.api.schemas import (
    Error,
    ForkIn,
    ForkOut,
    GrantOut,
    HoldIn,
    RetryIn,
    RetryManyIn,
    RetryManyOut,
    RunIn,
    RunOut,
    RunPage,
    TransitionOut,
)
from agents.models import Run, Transition

router = Router()


@router.post("/runs", response={200: RunOut, 201: RunOut, ERRORS: Error}, summary="Launch a run")
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
        raise forbidden("launching runs needs the launcher role")
    run = run_launch(
        agent=payload.agent,
        task=payload.task,
        user=user,
        approver=payload.approver,
        limits=payload.limits.model_dump(exclude_none=True) if payload.limits else None,
        script=payload.script,
        policy=payload.policy,
        idempotency_key=idempotency_key,
        idempotency_body=payload.model_dump(exclude_unset=True, mode="json"),
        by_launcher=True,
    )
    return Status(200 if run.replayed else 201, dict(run.to_dict()))


def _listable_runs(user: Any, params: dict[str, Any]) -> Any:
    if not access.may_read_runs(user):
        raise forbidden("reading runs needs the reviewer, operator or launcher role")
    # Runs of the caller's projects, a launcher's own only (access.visible_runs); a
    # project-limited token reaches its project alone. The filters only narrow.
    where = run_filters(params)
    # The engine state and the script are not in a run's JSON, and can be large.
    return access.visible_runs(user).filter(where).select_related("profile").defer("engine", "script")


@router.get("/runs", response={200: RunPage, ERRORS: Error}, summary="Runs, newest first")
def runs_list(request: HttpRequest, filters: Query[RunPageQuery]) -> dict[str, Any]:
    """The runs the caller may read (a launcher: their own), newest first, a page at a
    time: `next` is the cursor for `?after=`, null on the last page. Each filter narrows;
    a bad value is a 400 `invalid_filter` naming the field."""
    params = filters.model_dump()
    runs = _listable_runs(request.auth, params)  # type: ignore[attr-defined]
    return page(runs, params, NEWEST_FIRST, lambda r: dict(r.to_dict()), prepare=Run.prefetch_dicts)


TRANSITION_FIELDS = list(TransitionOut.model_fields)


def _lines(runs: Any, *, transitions: bool) -> Iterator[bytes]:
    for run in stream(runs, NEWEST_FIRST, prepare=Run.prefetch_dicts):
        item: dict[str, Any] = dict(run.to_dict())
        if transitions:
            item["transitions"] = list(run.transitions.order_by("seq").values(*TRANSITION_FIELDS))
        yield json.dumps(item, cls=DjangoJSONEncoder, ensure_ascii=False).encode() + b"\n"


@router.get(
    "/runs/export",
    response={ERRORS: Error},
    summary="Runs as JSON Lines",
    openapi_extra={
        "responses": {
            200: {
                "description": "one run per line, as GET /api/runs/<id> returns it (newest first)",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            }
        }
    },
)
def runs_export(request: HttpRequest, filters: Query[RunExportQuery]) -> StreamingHttpResponse:
    """Every run the caller may read that matches the filters (those of GET /api/runs),
    streamed as JSON Lines: one run's JSON per line, with its `transitions` when
    `transitions=1`. For a notebook or a warehouse: no pages, no limit."""
    params = filters.model_dump()
    transitions = wants_transitions(params)
    runs = _listable_runs(request.auth, params)  # type: ignore[attr-defined]  # refusals before the stream
    response = StreamingHttpResponse(_lines(runs, transitions=transitions), content_type="application/x-ndjson")
    response["Content-Disposition"] = 'attachment; filename="runs.jsonl"'
    return response


def _run_ahead(request: HttpRequest) -> tuple[str, list[Any]] | None:
    return access.run_read_for_dict(request.resolver_match.kwargs["run_id"])  # type: ignore[union-attr]


# A token's request reads the run in the token's round trip (the hot path, issue #48).
@router.get(
    "/runs/{int:run_id}", response={200: RunOut, ERRORS: Error}, summary="A run",
    auth=[TokenAuth(ahead=_run_ahead), SessionAuth()],
)
def runs_detail(request: HttpRequest, run_id: int) -> dict[str, Any]:
    read = getattr(request, "airlock_read", None)
    return dict(access.readable_run(request.auth, run_id, for_dict=True, read=read).to_dict())  # type: ignore[attr-defined]


@router.get(
    "/runs/{int:run_id}/transitions", response={200: list[TransitionOut], ERRORS: Error}, summary="A run's transitions"
)
def runs_transitions(request: HttpRequest, run_id: int) -> list[Transition]:
    run = access.readable_run(request.auth, run_id)  # type: ignore[attr-defined]
    return list(run.transitions.order_by("seq"))


@router.post("/runs/{int:run_id}/cancel", response={200: RunOut, ERRORS: Error}, summary="Cancel a run")
def runs_cancel(request: HttpRequest, run_id: int) -> dict[str, Any]:
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_cancel(user):
        raise forbidden("cancelling runs needs the operator role")
    run = _operated(user, run_id, "cancelling")
    run = run_cancel(run_id=run.pk, user=user, reason="through the API")
    return dict(Run.objects.select_related("profile").get(pk=run.pk).to_dict())


def _operated(user: Any, run_id: int, what: str) -> Run:
    """The run an operator acts on: 404 unless they may read it, 403 unless they are an
    operator in its project (an operator elsewhere who launched it may read, not act)."""
    run = access.readable_run(user, run_id)
    if not access.can_cancel(user, access.project_of(run)):
        raise forbidden(f"{what} runs needs the operator role in the run's project")
    return run


@router.post("/runs/{int:run_id}/hold", response={200: RunOut, ERRORS: Error}, summary="Put a run on legal hold")
def runs_hold(request: HttpRequest, run_id: int, body: HoldIn) -> dict[str, Any]:
    """A held run is never purged (docs/operations.md); `reason` is required."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_cancel(user):
        raise forbidden("holding runs needs the operator role")
    run = _operated(user, run_id, "holding")
    return dict(run_hold(run_id=run.pk, user=user, reason=body.reason).to_dict())


@router.post("/runs/{int:run_id}/release", response={200: RunOut, ERRORS: Error}, summary="Release a run's hold")
def runs_release(request: HttpRequest, run_id: int) -> dict[str, Any]:
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_cancel(user):
        raise forbidden("releasing held runs needs the operator role")
    run = _operated(user, run_id, "releasing")
    return dict(run_release(run_id=run.pk, user=user).to_dict())


@router.post(
    "/runs/{int:run_id}/grants/{int:grant_id}/revoke", response={200: GrantOut, ERRORS: Error}, summary="Revoke a grant"
)
def runs_grant_revoke(request: HttpRequest, run_id: int, grant_id: int) -> dict[str, Any]:
    """End a run-scoped grant: the calls it covered ask again. Revoking twice answers
    with the grant as it is."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_decide(user):
        raise forbidden("revoking grants needs the reviewer role")
    if not (0 < run_id <= access.MAX_ID and 0 < grant_id <= access.MAX_ID):
        raise ActionError("not_found", f"run {run_id} has no grant {grant_id}", status=404)
    run = access.readable_run(user, run_id)
    if not access.can_decide(user, access.project_of(run)):
        raise forbidden("revoking grants needs the reviewer role in the run's project")
    return grant_revoke(run_id=run_id, grant_id=grant_id, user=user).to_dict()


def _forkable(user: Any, run_id: int) -> Run:
    """The run if `user` may fork it: 404 when they cannot read it, 403 when they can
    read but not fork it (access.can_fork)."""
    run = access.readable_run(user, run_id)
    if not access.can_fork(user, run):
        raise forbidden("forking a run needs the operator role, or the launcher role for your own runs")
    return run


def _fork_answer(run: Run, point: forks.ForkPoint) -> Status[dict[str, Any]]:
    fresh = Run.objects.select_related("profile").get(pk=run.pk)
    return Status(201, {**fresh.to_dict(), "fork_point": point.to_dict()})


@router.post("/runs/retry", response={200: RetryManyOut, ERRORS: Error}, summary="Retry many failed runs")
def runs_retry_many(request: HttpRequest, body: RetryManyIn) -> dict[str, Any]:
    """Retry up to 200 failed runs, each from its last resting point: one result per id
    (`retried` with the new run, `refused` with why, or `not_found`)."""
    user = request.auth  # type: ignore[attr-defined]
    if not (access.can_cancel(user) or access.can_launch(user)):
        raise forbidden("retrying runs needs the operator role, or the launcher role for your own runs")
    return {"results": forks.runs_retry(ids=body.ids, user=user)}


@router.post("/runs/{int:run_id}/fork", response={201: ForkOut, ERRORS: Error}, summary="Fork a run from a step")
def runs_fork(request: HttpRequest, run_id: int, body: ForkIn) -> Status[dict[str, Any]]:
    """A new run of the same profile (as it is now) that starts from this run's state
    after transition `from_seq` (or the nearest earlier resting point: `fork_point` says
    so). Calls the parent already made are reused or asked about, never repeated blindly
    (docs/retry.md)."""
    user = request.auth  # type: ignore[attr-defined]
    run = _forkable(user, run_id)
    fork, point = forks.run_fork(
        run_id=run.pk, user=user, from_seq=body.from_seq, task=body.task,
        limits=body.limits.model_dump(exclude_none=True) if body.limits else None, note=body.note, reuse=body.reuse,
    )
    return _fork_answer(fork, point)


@router.post("/runs/{int:run_id}/retry", response={201: ForkOut, ERRORS: Error}, summary="Retry a failed run")
def runs_retry(request: HttpRequest, run_id: int, body: RetryIn | None = None) -> Status[dict[str, Any]]:
    """A fork of a failed run from its last resting point before the failure; `limits`
    may raise the run's budgets up to the profile's."""
    user = request.auth  # type: ignore[attr-defined]
    run = _forkable(user, run_id)
    limits = body.limits.model_dump(exclude_none=True) if body is not None and body.limits else None
    fork, point = forks.run_retry(run_id=run.pk, user=user, limits=limits)
    return _fork_answer(fork, point)
