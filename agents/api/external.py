"""/api/runs/<id>/calls and /finish: the decision API, through which an agent that runs
outside Airlock (an `external` profile's) proposes its calls, learns their fate,
reports its own tools' results and ends its run (docs/gateway.md)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from agents.actions import external
from agents.api.auth import SessionAuth, TokenAuth
from agents.api.errors import ERRORS
from agents.api.schemas import CallIn, CallOut, Error, FinishIn, ReportIn, RunOut
from agents.models import Run

router = Router()


def _status_ahead(request: HttpRequest) -> tuple[str, list[Any]] | None:
    kwargs = request.resolver_match.kwargs  # type: ignore[union-attr]
    return external.call_read_ahead(kwargs["run_id"], kwargs["key"], answer=True)


def _report_ahead(request: HttpRequest) -> tuple[str, list[Any]] | None:
    kwargs = request.resolver_match.kwargs  # type: ignore[union-attr]
    return external.call_read_ahead(kwargs["run_id"], kwargs["key"], answer=False)


# A token's status read or report reads the run and its call in the token's round trip
# (the hot path, issue #48); a session's reads them apart, as before.
_STATUS_AUTH = [TokenAuth(ahead=_status_ahead), SessionAuth()]
_REPORT_AUTH = [TokenAuth(ahead=_report_ahead), SessionAuth()]


@router.post("/runs/{int:run_id}/calls", response={200: CallOut, ERRORS: Error}, summary="Propose a call")
def runs_calls_create(request: HttpRequest, run_id: int, payload: CallIn) -> dict[str, Any]:
    """Propose one call of an external run. The answer's `key` names it from then on;
    an identical call (same tool, same arguments) answers with the same key and never
    runs twice; a different call while one waits is a 409 `call_pending`."""
    answer = external.call_propose(
        run_id=run_id, tool=payload.tool, args=payload.args, usage=payload.usage,
        user=request.auth,  # type: ignore[attr-defined]
    )
    return answer.to_dict()


@router.get(
    "/runs/{int:run_id}/calls/{key}", response={200: CallOut, ERRORS: Error}, summary="A proposed call", auth=_STATUS_AUTH
)
def runs_calls_detail(
    request: HttpRequest, run_id: int, key: str, wait: float = Query(0, ge=0, le=external.MAX_WAIT_SECONDS)
) -> dict[str, Any]:
    """The call as it stands; with `wait` (seconds, at most 30) the answer waits while
    the call is `pending` or `running`."""
    user = request.auth  # type: ignore[attr-defined]
    read = getattr(request, "airlock_read", None)
    if wait:
        return external.call_wait(run_id=run_id, key=key, user=user, wait=wait, read=read).to_dict()
    return external.call_status(run_id=run_id, key=key, user=user, read=read).to_dict()


@router.post(
    "/runs/{int:run_id}/calls/{key}/result", response={200: CallOut, ERRORS: Error}, summary="Report a client tool's result",
    auth=_REPORT_AUTH,
)
def runs_calls_result(request: HttpRequest, run_id: int, key: str, payload: ReportIn) -> dict[str, Any]:
    """The result of a client tool the client was allowed to run; a second report of
    the same call changes nothing."""
    answer = external.call_report(
        run_id=run_id, key=key, ok=payload.ok, output=payload.output,
        user=request.auth,  # type: ignore[attr-defined]
        read=getattr(request, "airlock_read", None),
    )
    return answer.to_dict()


@router.post("/runs/{int:run_id}/finish", response={200: RunOut, ERRORS: Error}, summary="Finish an external run")
def runs_finish(request: HttpRequest, run_id: int, payload: FinishIn) -> dict[str, Any]:
    run = external.run_finish(
        run_id=run_id, answer=payload.answer, usage=payload.usage,
        user=request.auth,  # type: ignore[attr-defined]
    )
    return dict(Run.objects.select_related("profile").get(pk=run.pk).to_dict())
