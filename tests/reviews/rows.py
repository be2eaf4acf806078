"""Approval rows with known times, for the review statistics and approval fatigue tests
(tests/reviews, tests/e2e): each says when it was asked, when it closed and how."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from agents.actions.runs import run_launch
from agents.models import AgentProfile, Approval, ApprovalClaim, Run

_ids = itertools.count(1)
DECISION = {"approved": "approve", "rejected": "reject", "expired": "", "pending": "", "denied": ""}


def a_run(agent: str = "scripted") -> Run:
    """A run to hang approvals on (never driven: the rows below are the figures)."""
    script = [{"final": "done"}] if agent == "scripted" else None
    return run_launch(agent=agent, task="stats", script=script)


def today_ago(seconds: float) -> float:
    """`seconds` ago, or less where that would fall before midnight UTC: a call the test
    means as closed today stays today when the test runs just after midnight."""
    now = timezone.now().astimezone(dt.UTC)
    since_midnight = (now - now.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds()
    return min(seconds, since_midnight / 2)


def profile_rule(index: int) -> dict[str, Any]:
    return {"tool": "ledger_write", "then": "ask", "reason": f"rule {index}", "origin": "profile", "index": index}


def approval(
    run: Run,
    *,
    status: str = "approved",
    wait: float = 60.0,
    closed_ago: float = 3600.0,
    by: User | None = None,
    tool: str = "ledger_write",
    args: Any = None,
    rule: dict[str, Any] | None = None,
    edited: bool = False,
    risk: str = "write",
    required: int = 1,
    now: dt.datetime | None = None,
    escalated_ago: float | None = None,
) -> Approval:
    """An approval asked `wait` seconds before it closed `closed_ago` seconds ago (a
    pending one: asked `wait` seconds ago)."""
    now = now or timezone.now()
    n = next(_ids)
    a = Approval.objects.create(
        run=run, tool=tool, args={"entry": f"e{n}"} if args is None else args, risk=risk, reason="asked",
        idempotency_key=f"{n:064d}", call_id=f"call-{n}", status=status, decision=DECISION[status],
        decided_by=by if status in ("approved", "rejected") else None, rule=rule, required=required,
        round=1 if edited else 0, edited_args={"entry": "edited"} if edited else None,
        via="dashboard" if status in ("approved", "rejected") else "",
    )
    if status == "pending":
        created, decided = now - dt.timedelta(seconds=wait), None
    else:
        decided = now - dt.timedelta(seconds=closed_ago)
        created = decided - dt.timedelta(seconds=wait)
    escalated = None if escalated_ago is None else now - dt.timedelta(seconds=escalated_ago)
    Approval.objects.filter(pk=a.pk).update(created_at=created, decided_at=decided, escalated_at=escalated)
    a.refresh_from_db()
    return a


def claim(a: Approval, user: User, *, until_ago: float, end: str = "", ended_ago: float | None = None) -> ApprovalClaim:
    now = timezone.now()
    ended = None if ended_ago is None else now - dt.timedelta(seconds=ended_ago)
    return ApprovalClaim.objects.create(
        approval=a, user=user, until=now - dt.timedelta(seconds=until_ago), end=end, ended_at=ended
    )


def streak(run: Run, n: int, *, by: User, rule: dict[str, Any] | None = None, start_ago: float = 7200.0,
           amounts: list[int] | None = None, **kwargs: Any) -> list[Approval]:
    """`n` refund-like calls approved unchanged, oldest first, a minute apart."""
    return [
        approval(run, by=by, rule=rule, closed_ago=start_ago - 60 * i,
                 args={"entry": "refund", "amount": (amounts or list(range(10, 10 + n)))[i]}, **kwargs)
        for i in range(n)
    ]


def three_days_and_a_streak(by: User) -> Run:
    """What the stats pages' browser tests draw: three days of decisions under rule 2
    (waits of 30 s, 90 s and 10 min) and a streak of 20 quick approvals under rule 1."""
    run = a_run()
    for day in range(3):
        for wait in (30, 90, 600):
            approval(run, by=by, wait=wait, closed_ago=day * 86400 + 3600, rule=profile_rule(2))
    streak(run, 20, by=by, rule=profile_rule(1), start_ago=3000)
    return run


def profile(name: str) -> AgentProfile:
    return AgentProfile.objects.get(name=name)
