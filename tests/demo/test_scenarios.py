"""The demo scenarios end to end through the synchronous driver and approval_decide."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from agents import demo
from agents.actions.approvals import approval_decide
from agents.actions.runs import run_launch
from agents.models import AgentProfile, Approval, LedgerEntry, Run

pytestmark = pytest.mark.django_db

SCENARIO = {s["name"]: s for s in demo.SCENARIOS}


def start(name: str, **kwargs) -> Run:
    s = SCENARIO[name]
    return run_launch(agent=s["agent"], task=s["task"], **kwargs)


def tool_sequence(run: Run) -> list[str]:
    return [c["tool"] for m in run.messages.filter(role="assistant").order_by("index") for c in (m.tool_calls or [])]


def test_customer_question_pauses_before_emailing_every_customer(defaults, drive, mailoutbox) -> None:
    run = drive(start("customer-question"))
    assert run.state == "awaiting_approval" and run.tainted
    assert tool_sequence(run) == ["kb_search", "http_get", "kb_search", "send_email"]
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.tool == "send_email"
    assert approval.reason == "send_email writes and the run has read external content"
    assert approval.taint_source["tool"] == "http_get"
    assert approval.args["to"] == [c["email"] for c in demo.CUSTOMERS]
    assert demo.DISCOUNT_CODE in approval.args["body"]
    assert mailoutbox == [] and not LedgerEntry.objects.exists()


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_approved_email_is_sent_exactly_once_and_the_customer_is_answered(defaults, drive, rita, mailoutbox) -> None:
    run = drive(start("customer-question"))
    approval = Approval.objects.get(run=run, status="pending")
    rob = User.objects.create_user("rob")
    assert approval_decide(approval_id=approval.pk, user=rita, decision="approve").won
    assert not approval_decide(approval_id=approval.pk, user=rob, decision="approve").won
    run = drive(run)
    drive(run)  # driving a finished run again sends nothing
    assert run.state == "done"
    assert "Canada and the United States: 6-9 business days" in run.answer
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == [c["email"] for c in demo.CUSTOMERS]
    assert mailoutbox[0].extra_headers["Message-ID"] == f"<{approval.idempotency_key}@airlock>"
    assert LedgerEntry.objects.filter(run=run, entry__kind="email").count() == 1


def test_rejected_email_is_not_sent_and_the_customer_still_gets_an_answer(defaults, drive, rita, mailoutbox) -> None:
    run = drive(start("customer-question"))
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="prompt injection")
    run = drive(run)
    assert run.state == "done" and "6-9 business days" in run.answer
    assert mailoutbox == [] and not LedgerEntry.objects.exists()
    assert "not_permitted" in run.messages.get(role="tool", name="send_email").content


def test_without_an_approver_the_email_is_denied_and_the_run_answers(defaults, drive, mailoutbox) -> None:
    run = drive(start("customer-question", approver="none"))
    assert run.state == "done" and mailoutbox == []
    assert Approval.objects.get(run=run).status == "denied"


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_refund_over_20_asks_by_the_profiles_rule_though_the_run_is_not_tainted(defaults, drive, rita) -> None:
    run = drive(start("refund-request"))
    assert run.state == "awaiting_approval" and not run.tainted
    approval = Approval.objects.get(run=run, status="pending")
    assert (approval.tool, approval.reason, approval.risk) == ("refund", "refunds of 20 or more need a human", "irreversible")
    assert approval.rule_label == "rule 5 of the profile"  # rules 1-3 remember (tests/demo/test_history_rules.py)
    assert approval.args["order_id"] == "1042" and approval.args["amount"] == 189
    assert not LedgerEntry.objects.exists()
    approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    run = drive(run)
    assert run.state == "done" and "refunded order 1042 in full (EUR 189.00)" in run.answer
    refunds = LedgerEntry.objects.filter(run=run, entry__kind="refund")
    assert refunds.count() == 1 and refunds.get().entry["amount_cents"] == 18900


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_an_edited_refund_amount_is_the_amount_the_customer_is_told(defaults, drive, rita) -> None:
    run = drive(start("refund-request"))
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", args={**approval.args, "amount": 100})
    run = drive(run)
    assert LedgerEntry.objects.get(run=run, entry__kind="refund").entry["amount_cents"] == 10000
    assert run.state == "done" and "refunded EUR 100.00 of order 1042 (EUR 189.00)" in run.answer
    assert "in full" not in run.answer


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_refund_under_20_is_allowed_by_the_profiles_rule(defaults, drive) -> None:
    run = drive(start("small-refund"))
    assert run.state == "done" and "refunded order 1045 in full (EUR 12.90)" in run.answer
    assert not Approval.objects.filter(run=run).exists()
    verdict = run.transitions.get(payload__verdict__action="allow").payload["verdict"]
    assert verdict["reason"] == "refunds under 20 need no human" and verdict["rule"]["index"] == 4
    assert LedgerEntry.objects.get(run=run, entry__kind="refund").entry["amount_cents"] == 1290


def test_rejected_refund_tells_the_customer_a_colleague_will_follow_up(defaults, drive, rita) -> None:
    run = drive(start("refund-request"))
    approval_decide(approval_id=Approval.objects.get(run=run).pk, user=rita, decision="reject")
    run = drive(run)
    assert run.state == "done" and "a colleague will review" in run.answer
    assert not LedgerEntry.objects.exists()


def test_plain_question_is_answered_without_approval(defaults, drive) -> None:
    run = drive(start("password-question"))
    assert run.state == "done" and "Forgot password" in run.answer
    assert not Approval.objects.filter(run=run).exists()
    assert run.tokens > 0 and not run.cost_unknown  # the planner reports (estimated) usage


def test_every_scenario_names_an_existing_agent(defaults) -> None:
    assert len(SCENARIO) == len(demo.SCENARIOS) >= 2
    for s in demo.SCENARIOS:
        assert AgentProfile.objects.filter(name=s["agent"]).exists()
        assert s["title"] and s["task"]
    assert AgentProfile.objects.get(name="demo").tools == ["kb_search", "http_get", "send_email", "refund", "export_customers"]


def crash_after_the_tool(monkeypatch, drive, run: Run) -> Run:
    """Drive until the approved tool ran and the worker 'dies' before saving its result,
    then resume as another worker would."""
    from agents.lib import faults

    monkeypatch.setattr(faults, "MODE", "raise")
    monkeypatch.setattr(faults, "CRASH_AT", frozenset({"after_tool_before_result_commit"}))
    with pytest.raises(faults.SimulatedCrash):
        drive(run)
    monkeypatch.setattr(faults, "CRASH_AT", frozenset())
    Run.objects.filter(pk=run.pk).update(lease_expires=None, lease_owner=None)  # the dead worker's lease lapsed
    return drive(run)


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_email_is_sent_once_even_when_the_worker_dies_after_sending(defaults, drive, rita, mailoutbox, monkeypatch) -> None:
    run = drive(start("customer-question"))
    approval_decide(approval_id=Approval.objects.get(run=run).pk, user=rita, decision="approve")
    run = crash_after_the_tool(monkeypatch, drive, run)
    assert run.state == "done"
    assert len(mailoutbox) == 1  # send_email is safe: the rerun found its key and sent nothing
    assert LedgerEntry.objects.filter(entry__kind="email").count() == 1


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_interrupted_refund_asks_whether_it_happened(defaults, drive, rita, monkeypatch) -> None:
    run = drive(start("refund-request"))
    approval_decide(approval_id=Approval.objects.get(run=run).pk, user=rita, decision="approve")
    run = crash_after_the_tool(monkeypatch, drive, run)
    assert run.state == "awaiting_approval"
    unknown = Approval.objects.get(run=run, status="pending")
    assert unknown.kind == "outcome_unknown" and unknown.tool == "refund"
    approval_decide(approval_id=unknown.pk, user=rita, decision="happened", note="refund R-77 is in the ledger")
    run = drive(run)
    assert run.state == "done" and "refunded it in full" in run.answer
    assert LedgerEntry.objects.filter(entry__kind="refund").count() == 1
