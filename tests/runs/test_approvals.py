"""Taint, approvals, rejections and runs without an approver, through the store."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.engine.run import RunState
from agents.models import Approval, Message, Run
from agents.runs import store
from tests.helpers import at_once, call, final, requires_postgres, tainted_write

pytestmark = pytest.mark.django_db

@pytest.fixture
def reviewers(rita: User, rob: User) -> tuple[User, User]:
    return rita, rob


def test_tainted_write_pauses_for_approval_with_reason_and_source(launch, drive) -> None:
    run = drive(launch(tainted_write()))
    assert run.state == "awaiting_approval" and run.tainted
    approval = Approval.objects.get(run=run)
    assert approval.status == "pending" and approval.tool == "ledger_write"
    assert approval.args == {"entry": "discount code to all"}
    assert approval.reason == "ledger_write writes and the run has read external content"
    assert approval.taint_source["tool"] == "fetch_fixture"
    assert run.ledger.count() == 0
    tainting = run.transitions.get(payload__tainted=True)
    assert tainting.payload["call"]["id"] == approval.taint_source["call_id"]


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_paused_run_survives_json_round_trip_reload_and_double_approval(launch, drive, reviewers) -> None:
    run = drive(launch(tainted_write()))
    state = store.load(Run.objects.get(pk=run.pk))
    assert RunState.from_json(json.loads(json.dumps(state.engine_json())), state.messages) == state
    approval = Approval.objects.get(run=run)
    rita, rob = reviewers
    first = approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    second = approval_decide(approval_id=approval.pk, user=rob, decision="approve")
    assert first.won and not second.won
    assert second.approval.decided_by == rita  # the late answer is told who decided
    run = drive(run)
    assert run.state == "done" and run.answer == "answered"
    assert run.ledger.count() == 1
    assert run.transitions.filter(kind="decision").count() == 1


@pytest.mark.django_db(transaction=True)  # threads racing see only committed rows
@requires_postgres()
def test_two_threads_approving_at_once_execute_once(launch, drive, reviewers) -> None:
    run = drive(launch(tainted_write()))
    approval = Approval.objects.get(run=run)
    results = at_once(lambda user: approval_decide(approval_id=approval.pk, user=user, decision="approve"), reviewers)
    assert sorted(r.won for r in results) == [False, True]
    winner = next(r for r in results if r.won).approval.decided_by
    assert all(r.approval.decided_by == winner for r in results)
    run = drive(run)
    assert run.ledger.count() == 1 and run.state == "done"


def test_rejection_reaches_the_model_with_the_note(launch, drive, reviewers) -> None:
    run = drive(launch(tainted_write()))
    approval = Approval.objects.get(run=run)
    approval_decide(approval_id=approval.pk, user=reviewers[0], decision="reject", note="never email customers a code")
    run = drive(run)
    assert run.state == "done" and run.ledger.count() == 0
    result = json.loads(Message.objects.filter(run=run, role="tool").order_by("-index").first().content)
    assert result == {
        "ok": False,
        "error": "not_permitted",
        "detail": "rejected by a human reviewer (rita): never email customers a code",
    }
    assert Approval.objects.get(pk=approval.pk).status == "rejected"


def test_without_an_approver_the_write_is_denied_and_the_run_finishes(launch, drive) -> None:
    run = drive(launch(tainted_write(), approver="none"))
    assert run.state == "done" and run.ledger.count() == 0
    approval = Approval.objects.get(run=run)
    assert approval.status == "denied"
    result = json.loads(Message.objects.filter(run=run, role="tool").order_by("-index").first().content)
    assert result["error"] == "not_permitted" and "no approver" in result["detail"]


def test_irreversible_tool_in_always_ask_asks(launch, drive, defaults) -> None:
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="scripted").update(always_ask_tools=["echo"])
    run = drive(launch([call("echo", text="hi"), final()]))
    assert run.state == "awaiting_approval"
    assert Approval.objects.get(run=run).reason == "the agent profile always asks before echo"


def test_profile_denied_tool_is_refused_as_a_result(launch, drive, defaults) -> None:
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="scripted").update(denied_tools=["ledger_write"])
    run = drive(launch([call("ledger_write", entry=1), final()]))
    assert run.state == "done" and run.ledger.count() == 0
    result = json.loads(Message.objects.get(run=run, role="tool").content)
    assert result == {"ok": False, "error": "not_permitted", "detail": "the agent profile denies the tool ledger_write"}
