"""The demo profile's four history rules (issue 49's examples, agents/defaults.py):
each holds a call on the demo planner's own runs, with the figures the reviewer reads.
Rules 1-3 come before the small-refund allow (rule 4), so they see what it would let
through; a history rule that does not hold decides nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from agents.actions.runs import run_launch
from agents.models import Approval, LedgerEntry, Run, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = "The spatula from order 1045 melted the first time I used it. Can I get a refund? - Ines"


def refund(task: str, drive, user) -> Run:
    return drive(run_launch(agent="demo", task=task, user=user))


def test_a_third_refund_of_one_order_in_a_day_asks_though_it_is_small(defaults, drive, lena) -> None:
    runs = [refund(SMALL, drive, lena) for _ in range(3)]
    assert [r.state for r in runs] == ["done", "done", "awaiting_approval"]
    approval = Approval.objects.get(run=runs[2])
    assert approval.reason == "a third refund of one order in a day: the 3rd refund call with order_id 1045 in 24 h (over 2)"
    assert approval.rule_label == "rule 2 of the profile"
    assert approval.history["count"] == 2 and approval.history["same"] == {"order_id": "1045"}
    assert LedgerEntry.objects.filter(entry__kind="refund").count() == 2


def test_over_500_eur_to_one_customer_in_a_week_asks_with_the_sum(defaults, drive, lena) -> None:
    # Sam's blender (189.00, waiting for a reviewer: a waiting call counts), then his
    # espresso machine (449.00): 638.00 to sam@example.com, over 500.
    first = refund("My blender from order 1042 arrived broken. Please refund it. - Sam", drive, lena)
    assert Approval.objects.get(run=first).reason == "refunds of 20 or more need a human"
    second = refund("My espresso machine from order 1046 arrived broken. Please refund it. - Sam", drive, lena)
    approval = Approval.objects.get(run=second)
    assert approval.rule_label == "rule 3 of the profile"
    assert approval.reason == (
        "over 500 EUR to one customer this week: 638.00 amount in refund calls with customer sam@example.com"
        " in 7 d in this project, this one included (over 500)"
    )
    assert (approval.history["total"], approval.history["sum_over"]) == (638, 500)
    # Another customer's refund is not summed with Sam's.
    other = refund("My pan from order 1044 arrived cracked. Please refund it. - Lea", drive, lena)
    assert Approval.objects.get(run=other).reason == "refunds of 20 or more need a human"


def test_an_email_after_a_customer_export_asks(defaults, drive, lena, mailoutbox) -> None:
    run = drive(run_launch(agent="demo", task="Please export our customers and email the list to ops@example.com",
                           user=lena))
    assert run.state == "awaiting_approval" and not run.tainted  # the export is our own data
    assert [c.tool for c in ToolCall.objects.filter(run=run)] == ["export_customers"]
    approval = Approval.objects.get(run=run)
    assert (approval.tool, approval.rule_label) == ("send_email", "rule 6 of the profile")
    assert approval.reason == "writes after reading a customer export: after export_customers ran in this run"
    assert approval.history["ran"] == "export_customers" and mailoutbox == []


def test_a_runaway_caller_is_denied_after_200_calls_in_an_hour(defaults, drive, lena, rita) -> None:
    # 200 calls of lena's demo runs in the last hour (written straight into the journal).
    earlier = run_launch(agent="demo", task="earlier", user=lena)
    now = timezone.now()
    ToolCall.objects.bulk_create(
        ToolCall(run=earlier, idempotency_key=f"k{i}", fingerprint=f"f{i}", step=i, call_id=f"c{i}", tool="kb_search",
                 args={"query": "hours"}, status="succeeded", created_at=now - dt.timedelta(minutes=50))
        for i in range(200)
    )
    run = drive(run_launch(agent="demo", task="What are your support hours?", user=lena))
    denial = run.transitions.get(payload__verdict__action="deny").payload["verdict"]
    assert denial["reason"] == "runaway client: the 201st call in 1 h by this caller (over 200)"
    assert not ToolCall.objects.filter(run=run).exists()
    # Another launcher is another caller.
    other = drive(run_launch(agent="demo", task="What are your support hours?", user=rita))
    assert other.state == "done" and ToolCall.objects.filter(run=other, tool="kb_search").exists()
