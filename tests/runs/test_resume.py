"""Crashes inside `acting`: the resumption contract, through the store."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.lib import faults
from agents.models import Approval, ToolCall
from tests.helpers import call, final

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def crash_at(monkeypatch):
    def _set(point: str) -> None:
        monkeypatch.setattr(faults, "MODE", "raise")
        monkeypatch.setattr(faults, "CRASH_AT", frozenset({point}))

    yield _set


def crash_then_resume(launch, drive, crash_at, monkeypatch, tool: str):
    run = launch([call(tool, entry="once"), final("finished")])
    crash_at("after_tool_before_result_commit")
    with pytest.raises(faults.SimulatedCrash):
        drive(run)
    monkeypatch.setattr(faults, "CRASH_AT", frozenset())
    entry = ToolCall.objects.get(run=run)
    assert entry.result is None  # the crash left an intent without a result
    run.refresh_from_db()
    assert run.state == "acting" and run.ledger.count() == 1
    # The dead worker's lease must lapse before anyone else may take the run.
    type(run).objects.filter(pk=run.pk).update(lease_expires=None, lease_owner=None)
    return drive(run)


def test_safe_tool_is_run_again_with_the_same_key(launch, drive, crash_at, monkeypatch) -> None:
    run = crash_then_resume(launch, drive, crash_at, monkeypatch, "ledger_write")
    assert run.state == "done" and run.answer == "finished"
    assert run.ledger.count() == 1
    entry = ToolCall.objects.get(run=run)
    assert entry.status == "succeeded" and run.ledger.get().idempotency_key == entry.idempotency_key


def test_unsafe_tool_becomes_an_outcome_unknown_approval(launch, drive, crash_at, monkeypatch) -> None:
    run = crash_then_resume(launch, drive, crash_at, monkeypatch, "ledger_write_unsafe")
    assert run.state == "awaiting_approval"
    approval = Approval.objects.get(run=run)
    assert approval.kind == "outcome_unknown" and approval.reason.startswith("outcome unknown")
    assert run.ledger.count() == 1  # not run a second time without a human
    reviewer = User.objects.create_user("rita")
    approval_decide(approval_id=approval.pk, user=reviewer, decision="happened", note="I saw the row")
    run = drive(run)
    assert run.state == "done" and run.ledger.count() == 1
    assert ToolCall.objects.get(run=run).result == {"ok": True, "result": "I saw the row"}


def test_outcome_unknown_run_it_again_executes_once_more(launch, drive, crash_at, monkeypatch) -> None:
    run = crash_then_resume(launch, drive, crash_at, monkeypatch, "ledger_write_unsafe")
    approval = Approval.objects.get(run=run)
    approval_decide(approval_id=approval.pk, user=User.objects.create_user("rita"), decision="retry")
    run = drive(run)
    assert run.state == "done" and run.ledger.count() == 2
    assert ToolCall.objects.get(run=run).attempts == 2


def test_outcome_unknown_fail_the_run(launch, drive, crash_at, monkeypatch) -> None:
    run = crash_then_resume(launch, drive, crash_at, monkeypatch, "ledger_write_unsafe")
    approval = Approval.objects.get(run=run)
    approval_decide(approval_id=approval.pk, user=User.objects.create_user("rita"), decision="fail", note="bad")
    run.refresh_from_db()
    assert run.state == "failed" and "outcome unknown" in run.error
    assert Approval.objects.get(pk=approval.pk).status == "rejected"


def test_crash_after_the_intent_commit_runs_a_safe_tool_once(launch, drive, crash_at, monkeypatch) -> None:
    run = launch([call("ledger_write", entry="x"), final()])
    crash_at("after_intent_commit")
    with pytest.raises(faults.SimulatedCrash):
        drive(run)
    monkeypatch.setattr(faults, "CRASH_AT", frozenset())
    assert run.ledger.count() == 0 and ToolCall.objects.get(run=run).status == "intended"
    type(run).objects.filter(pk=run.pk).update(lease_expires=None, lease_owner=None)
    run = drive(run)
    assert run.state == "done" and run.ledger.count() == 1


def test_crash_after_the_intent_commit_does_not_flag_an_unsafe_tool(launch, drive, crash_at, monkeypatch) -> None:
    # The intent is "intended", not "started": nothing ran, so no human is needed.
    run = launch([call("ledger_write_unsafe", entry="x"), final()])
    crash_at("after_intent_commit")
    with pytest.raises(faults.SimulatedCrash):
        drive(run)
    monkeypatch.setattr(faults, "CRASH_AT", frozenset())
    type(run).objects.filter(pk=run.pk).update(lease_expires=None, lease_owner=None)
    run = drive(run)
    assert run.state == "done" and run.ledger.count() == 1
