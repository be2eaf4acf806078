"""Actions the pages, the API and the commands share: one function each."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import faults, store
from agents.engine import states
from agents.engine import step as engine
from agents.engine.limits import LimitError
from agents.llm.scripted import ScriptError, validate_script
from agents.models import AgentProfile, Approval, Run


class ActionError(Exception):
    """A refused action, with a short machine code and a readable detail."""

    def __init__(self, code: str, detail: Any, *, status: int = 400) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status


def actor_name(user: Any) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


def _after_commit(run_id: int) -> None:
    # Wake a worker once the rows are visible; the sweeper covers a lost wake-up.
    # Imported here: the tasks module imports the store, which actions also imports.
    from agents import tasks

    transaction.on_commit(lambda: tasks.wake(run_id))


def run_launch(
    *,
    agent: str | AgentProfile,
    task: str,
    user: Any = None,
    approver: str = "human",
    limits: dict[str, Any] | None = None,
    script: Any = None,
) -> Run:
    profile = agent if isinstance(agent, AgentProfile) else AgentProfile.objects.filter(name=agent).first()
    if profile is None:
        known = ", ".join(AgentProfile.objects.order_by("name").values_list("name", flat=True))
        raise ActionError("unknown_agent", f"no agent profile named {agent!r} (known: {known})")
    if not isinstance(task, str) or not task.strip():
        raise ActionError("invalid_task", "the task must be non-empty text")
    if approver not in ("human", "none"):
        raise ActionError("invalid_approver", "approver must be 'human' or 'none'")
    if profile.provider == "scripted":
        if not settings.AIRLOCK_ALLOW_SCRIPTED:
            raise ActionError("scripted_disabled", "scripted runs are off (AIRLOCK_ALLOW_SCRIPTED)", status=403)
        try:
            validate_script(script if script is not None else [])
        except ScriptError as exc:
            raise ActionError("invalid_script", str(exc)) from None
    elif script is not None:
        raise ActionError("invalid_script", f"the {profile.name} agent takes no script")
    try:
        run_limits = profile.base_limits().tightened(limits)
    except LimitError as exc:
        raise ActionError("invalid_limits", str(exc)) from None
    state = engine.new_run(
        "pending",
        limits=run_limits,
        now=time.time(),
        approver=approver,
        tools=profile.tools or None,
        denied_tools=profile.denied_tools,
        always_ask_tools=profile.always_ask_tools,
        prices=profile.prices(),
        system_prompt=profile.system_prompt,
        task=task,
    )
    with transaction.atomic():
        run = Run(profile=profile, task=store.clean(task), created_by=user, approver=approver, script=store.clean(script))
        # The id is the run's identity in every idempotency key: take it first.
        run.deadline = timezone.now()
        run.save()
        state.run_id = str(run.pk)
        store.create(run, state, actor=actor_name(user))
        transaction.on_commit(lambda: faults.crash_point("after_launch_commit"))
        _after_commit(run.pk)
    return run


DECISION_STATUS = {"approve": "approved", "reject": "rejected", "happened": "approved", "retry": "approved", "fail": "rejected"}
KIND_DECISIONS = {"policy": ("approve", "reject"), "outcome_unknown": ("happened", "retry", "fail")}


@dataclass
class DecisionResult:
    approval: Approval
    won: bool  # False: someone else had decided first; `approval` shows their answer


def approval_decide(*, approval_id: int, user: Any, decision: str, note: str = "") -> DecisionResult:
    """Record a reviewer's answer; the first answer wins, later ones change nothing.

    1. Conditional update `WHERE status = 'pending'`: exactly one caller gets a row.
    2. The winner applies the engine's transition in the same database transaction,
       so a decision never exists without its transition.
    3. The winner wakes a worker after commit; losers get the recorded decision.
    """
    approval = Approval.objects.filter(pk=approval_id).first()
    if approval is None:
        raise ActionError("not_found", f"no approval {approval_id}", status=404)
    allowed = KIND_DECISIONS[approval.kind]
    if decision not in allowed:
        raise ActionError("invalid_decision", f"this approval takes {' or '.join(allowed)}, not {decision!r}")
    note = store.clean(note or "")
    with transaction.atomic():
        updated = Approval.objects.filter(pk=approval_id, status="pending").update(
            status=DECISION_STATUS[decision], decision=decision, decided_by=user, decided_at=timezone.now(), note=note
        )
        if updated != 1:
            # Someone decided (or the sweeper expired it) first: their answer stands.
            return DecisionResult(Approval.objects.select_related("decided_by").get(pk=approval_id), won=False)
        run = Run.objects.select_for_update().get(pk=approval.run_id)
        state = store.load(run)
        after, t = engine.decide(state, decision, note, by=user.get_username() if user else "")
        store.commit(run, state, after, t, actor=actor_name(user))
        if after.state not in states.TERMINAL:
            _after_commit(run.pk)
    return DecisionResult(Approval.objects.select_related("decided_by").get(pk=approval_id), won=True)


def run_cancel(*, run_id: int, user: Any, reason: str = "") -> Run:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise ActionError("not_found", f"no run {run_id}", status=404)
    for _ in range(5):
        if run.state in states.TERMINAL:
            raise ActionError("not_active", f"run {run_id} already ended ({run.state})", status=409)
        state = store.load(run)
        who = user.get_username() if user else "system"
        after, t = engine.cancel(state, f"cancelled by {who}" + (f": {reason}" if reason else ""))
        try:
            store.commit(run, state, after, t, actor=actor_name(user))
            return run
        except store.StaleRun:
            # A worker committed in between; cancel the state it left.
            run.refresh_from_db()
    raise ActionError("busy", f"run {run_id} kept moving; try again", status=409)
