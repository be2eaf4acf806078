"""A run's policy is snapshotted at launch; approvals record the rule that asked."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agents.models import AgentProfile, Approval, Run
from tests.helpers import call, final

pytestmark = pytest.mark.django_db

OVER_100 = {"tool": "ledger_write", "when": {"arg": "entry.amount", "op": "gt", "value": 100}, "then": "ask",
            "approvals": 2, "reason": "entries over 100 need a human"}


def test_launch_snapshots_launch_rules_first_then_the_profiles(launch) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[OVER_100], irreversible_approvals=2)
    run = launch([final()], policy={"rules": [{"tool": "echo", "then": "deny", "reason": "no echo today"}]})
    policy = Run.objects.get(pk=run.pk).policy()
    assert [(r["origin"], r["index"], r["reason"]) for r in policy["rules"]] == [
        ("launch", 1, "no echo today"),
        ("profile", 1, "entries over 100 need a human"),
    ]
    assert policy["irreversible_approvals"] == 2 and policy["separate_duties"] is False
    assert policy["approval_timeout_seconds"] is None and policy["on_expiry"] == "reject"


def test_a_profile_edit_never_changes_a_launched_run(launch) -> None:
    run = launch([final()])
    AgentProfile.objects.filter(name="scripted").update(rules=[OVER_100], separate_duties=True)
    assert Run.objects.get(pk=run.pk).policy()["rules"] == []
    assert Run.objects.get(pk=run.pk).policy()["separate_duties"] is False


def test_a_run_without_a_snapshot_gets_its_profiles_fields_and_no_rules(launch) -> None:
    run = launch([final()])
    engine = dict(run.engine)
    engine.pop("policy")
    Run.objects.filter(pk=run.pk).update(engine=engine)
    AgentProfile.objects.filter(name="scripted").update(rules=[OVER_100], approval_timeout_seconds=60)
    policy = Run.objects.get(pk=run.pk).policy()
    assert policy == {"rules": [], "irreversible_approvals": 1, "separate_duties": False,
                      "approval_timeout_seconds": 60, "on_expiry": "reject"}


def test_the_approval_records_the_rule_and_the_votes_it_needs(launch, drive) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[OVER_100])
    run = drive(launch([call("ledger_write", entry={"amount": 150}), final()]))
    approval = Approval.objects.get(run=run)
    assert run.state == "awaiting_approval"
    assert approval.reason == "entries over 100 need a human" and approval.required == 2
    assert approval.rule == {**OVER_100, "origin": "profile", "index": 1}


def test_an_irreversible_call_without_a_rule_needs_the_profiles_votes(launch, drive) -> None:
    # tools=None offers every registered tool, the demo's irreversible refund too.
    AgentProfile.objects.filter(name="scripted").update(irreversible_approvals=3, tools=None)
    run = drive(launch([call("refund", order_id="1042", reason="broken"), final()]))
    approval = Approval.objects.get(run=run)
    assert approval.rule is None and approval.required == 3


def test_profile_clean_names_the_bad_rule_field() -> None:
    profile = AgentProfile(name="p", provider="scripted", rules=[{"tool": "refund", "then": "maybe", "reason": "x"}])
    with pytest.raises(ValidationError) as caught:
        profile.clean()
    assert caught.value.message_dict["rules"] == ["rules[1].then: must be allow, ask or deny, not 'maybe'"]
