"""/api/runs: launch, read, follow and cancel runs, and revoke their grants."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Header, Router, Status

from agents import access, actions
from agents.actions import ActionError
from agents.api.errors import ERRORS, forbidden
from agents.api.schemas import Error, GrantOut, RunIn, RunOut, TransitionOut
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
    run = actions.run_launch(
        agent=payload.agent,
        task=payload.task,
        user=user,
        approver=payload.approver,
        limits=payload.limits.model_dump(exclude_none=True) if payload.limits else None,
        script=payload.script,
        policy=payload.policy,
        idempotency_key=idempotency_key,
        idempotency_body=payload.model_dump(exclude_unset=True, mode="json"),
    )
    return Status(200 if run.replayed else 201, dict(run.to_dict()))


@router.get("/runs/{int:run_id}", response={200: RunOut, ERRORS: Error}, summary="A run")
def runs_detail(request: HttpRequest, run_id: int) -> dict[str, Any]:
    return dict(access.readable_run(request.auth, run_id).to_dict())  # type: ignore[attr-defined]


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
    if not 0 < run_id <= access.MAX_ID:
        raise ActionError("not_found", f"no run {run_id}", status=404)
    run = actions.run_cancel(run_id=run_id, user=user, reason="through the API")
    return dict(Run.objects.select_related("profile").get(pk=run.pk).to_dict())


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
    return actions.grant_revoke(run_id=run_id, grant_id=grant_id, user=user).to_dict()
