"""Approvals nobody answers, with real `celery worker` and `celery beat` processes: the
sweeper expires them (never a rejection) and the run's `on_expiry` decides what follows."""

from __future__ import annotations

import json

from agents.defaults import DIAGNOSTIC_TOOLS
from agents.models import AgentProfile, Approval, LedgerEntry
from tests.helpers import call, final, state_of, wait_for
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS

ASK = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("told the customer we could not pay yet")]


def test_an_unanswered_approval_expires_and_the_agent_goes_on(cluster: Cluster, launch, drive) -> None:
    run = drive(launch(SCRIPT, policy={"rules": [ASK], "approval_timeout_seconds": 2}))
    assert run.state == "awaiting_approval"
    approval = Approval.objects.get(run=run)
    assert approval.expires_at is not None
    cluster.start_worker("w1")
    cluster.start_beat()
    wait_for(lambda: state_of(run.pk) == "done", what="the sweeper to expire the approval and a worker to finish")
    run.refresh_from_db()
    approval.refresh_from_db()
    assert approval.status == "expired" and approval.decided_by is None
    expiry = run.transitions.get(kind="expiry")
    assert (expiry.from_state, expiry.to_state) == ("awaiting_approval", "planning")
    assert expiry.actor.startswith("sweeper:")
    # A worker, not the sweeper, took the run from there to its answer.
    assert run.transitions.filter(seq__gt=expiry.seq, actor__startswith="worker:").exists()
    reply = json.loads(run.messages.get(role="tool").content)
    assert reply == {"ok": False, "error": "not_permitted", "detail": "no reviewer answered within 2 s"}
    assert run.answer == "told the customer we could not pay yet"
    assert not LedgerEntry.objects.filter(run=run).exists()


def test_an_unanswered_approval_fails_the_run_when_the_policy_says_so(cluster: Cluster, launch, drive) -> None:
    AgentProfile.objects.create(
        name="strict", provider="scripted", model_name="script", tools=DIAGNOSTIC_TOOLS, separate_duties=False,
        approval_timeout_seconds=2, on_expiry="fail",
    )
    run = drive(launch(SCRIPT, agent="strict", policy={"rules": [ASK]}))
    assert run.state == "awaiting_approval"
    cluster.start_worker("w1")
    cluster.start_beat()
    wait_for(lambda: state_of(run.pk) == "failed", what="the sweeper to fail the run")
    run.refresh_from_db()
    assert run.error == "no reviewer answered within 2 s"
    assert Approval.objects.get(run=run).status == "expired"
    last = run.transitions.order_by("-seq").first()
    assert (last.kind, last.from_state, last.to_state) == ("expiry", "awaiting_approval", "failed")
    assert last.actor.startswith("sweeper:") and last.payload["on_expiry"] == "fail"
