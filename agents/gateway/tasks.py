"""A held call as a task: the MCP tasks extension (`io.modelcontextprotocol/tasks`,
SEP-2663) in the 2026-07-28 era (docs/gateway.md, "Tasks").

A client that declares the extension in a tools/call's per-request capabilities gets,
for a call that waits for a human (or is still running when its round's wait is up),
a task handle (`resultType: "task"`) instead of `input_required` rounds. The task is a
row (`GatewayTask`) written before the handle is sent, so `tasks/get` finds it from
any connection and any web process; it names the call, and every `tasks/get` reads
the call as it stands (and runs it, once approved, as a held call's next round does:
`core.call_resume`, under the run's lease and journal). So a web process killed after
the handle went out loses nothing: the next poll, wherever it lands, carries on.

- `working`: held for a reviewer, or running; `statusMessage` says which (and where
  to review).
- `completed`: the call's outcome, as a tools/call would have answered it: the
  upstream's result, or an error result with the reviewer's note (rejected), the
  policy's reason (denied) or the expiry. The extension keeps `failed` for JSON-RPC
  errors, which a decision is not, and a model reads an error result where a client
  would raise on a failed task.
- `cancelled`: the client withdrew the call with `tasks/cancel` while it was held:
  its run is cancelled with the reason on the timeline (a stream's run holds one call
  at a time, so that is the call, and nothing of it runs); the stream's next call
  continues in a new run, keeping its taint. A call already approved or running goes
  on (cancellation is cooperative), and its task ends as the call does.

A task is its caller's (the token's user and the profile): another caller's
`tasks/get` or `tasks/cancel` is refused as an unknown task.
"""

from __future__ import annotations

import secrets
from typing import Any

import mcp_types as types
from django.utils import timezone
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, INVALID_PARAMS

from agents.actions import external
from agents.actions.base import ActionError
from agents.actions.runs import run_cancel
from agents.models import GatewayTask, Run

from . import content, core

EXTENSION = "io.modelcontextprotocol/tasks"
# How often a client should poll: a reviewer's decision takes seconds to hours.
POLL_INTERVAL_MS = 2000


class UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any] = {}


def wanted(meta: Any) -> bool:
    """Whether a request's `_meta` declares the extension (a server must not answer a
    task to a client that did not, on that very request)."""
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def _stamp(value: Any) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _shape(task: GatewayTask, status: str, message: str, updated: Any) -> dict[str, Any]:
    return {
        "taskId": task.task_id,
        "status": status,
        "statusMessage": message,
        "createdAt": _stamp(task.created_at),
        "lastUpdatedAt": _stamp(max(updated, task.created_at)),
        "ttlMs": None,  # kept as long as its run: the outcome stays readable
        "pollIntervalMs": POLL_INTERVAL_MS,
    }


def create(caller: core.Caller, run_id: int, answer: external.CallAnswer) -> dict[str, Any]:
    """The task of a call still waiting, created (or found: the same call held again
    answers its task) before its handle goes out."""
    task, _ = GatewayTask.objects.get_or_create(
        run_id=run_id, key=answer.key,
        defaults={"task_id": secrets.token_urlsafe(24), "user": caller.user, "profile_id": caller.profile_id},
    )
    if task.user_id != caller.user.pk or task.profile_id != caller.profile_id:
        raise MCPError(code=INVALID_PARAMS, message="the call belongs to another caller")  # a stream is one caller's
    return {"resultType": "task", **_shape(task, "working", core.reply(answer, run_id).text, timezone.now())}


def _find(caller: core.Caller, task_id: str) -> GatewayTask:
    task = GatewayTask.objects.filter(task_id=task_id, user=caller.user, profile_id=caller.profile_id).first()
    if task is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown task {task_id[:64]!r}", data={"reason": "unknown_task"})
    return task


def _updated(run_id: int) -> Any:
    return Run.objects.filter(pk=run_id).values_list("updated_at", flat=True).first() or timezone.now()


def get(caller: core.Caller, task_id: str) -> dict[str, Any]:
    """`tasks/get`: the task as its call stands, run now if it was just approved."""
    task = _find(caller, task_id)
    if task.cancelled_at is not None:
        return _shape(task, "cancelled", "Withdrawn by the client (tasks/cancel); it did not run.", task.cancelled_at)
    started = core.call_resume(caller, task.run_id, task.key)
    if isinstance(started, core.Reply):
        reply, status = started, "completed"
    else:
        answer, run_id = started
        reply, status = core.reply(answer, run_id), "working" if core.waiting(answer) else "completed"
    shaped = _shape(task, status, reply.text, _updated(task.run_id))
    if status == "completed":
        result = content.call_result(reply.text, reply.is_error, reply.structured, reply.content)
        shaped["result"] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return shaped


def cancel(caller: core.Caller, task_id: str) -> dict[str, Any]:
    """`tasks/cancel`: a held call is withdrawn (its run cancelled, the reason on the
    timeline, nothing run); a call already approved, running or finished goes on."""
    task = _find(caller, task_id)
    if task.cancelled_at is not None:
        return {}
    answer = external.call_status(run_id=task.run_id, key=task.key, user=caller.user)
    if answer.status != external.PENDING:
        return {}
    try:
        run_cancel(run_id=task.run_id, user=caller.user,
                   reason=f"the client withdrew its held call {answer.tool} (tasks/cancel)")
    except ActionError:
        return {}  # decided or ended in between: the task ends as the call does
    # A decision that landed first made run_cancel refuse; past it, the call is withdrawn.
    GatewayTask.objects.filter(pk=task.pk, cancelled_at__isnull=True).update(cancelled_at=timezone.now())
    return {}


def update(caller: core.Caller, task_id: str) -> dict[str, Any]:
    """`tasks/update`: acknowledged. A gateway task never asks its client for input
    (the human it waits for is a reviewer), so every response is for a request that is
    not outstanding, which the extension says to ignore."""
    _find(caller, task_id)
    return {}
