"""backtest_policy: what a proposed policy would have done to recorded calls."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agents.actions.approvals import approval_decide
from agents.engine import policy
from agents.models import AgentProfile, Approval, Run, Transition
from agents.runs import backtest as bt
from agents.tools import registry
from tests.helpers import call, counts, final

pytestmark = pytest.mark.django_db(transaction=True)  # the history fixture's tools write from the tool thread

ASK_20 = {
    "tool": "ledger_write",
    "when": {"arg": "entry.amount", "op": "gte", "value": 20},
    "then": "ask",
    "reason": "entries of 20 or more need a human",
}


def write(amount: int) -> dict[str, Any]:
    return call("ledger_write", entry={"amount": amount})


@pytest.fixture
def history(launch, drive, lena, rita) -> dict[str, Any]:
    """A varied history under the scripted profile: allowed, asked and approved, asked
    and rejected, tainted, denied by the profile, denied for want of an approver, a
    read, a shadow rule, and a run-scoped grant."""
    AgentProfile.objects.filter(name="scripted").update(
        rules=[
            ASK_20,
            {
                "tool": "echo",
                "when": {"arg": "text", "op": "eq", "value": "x"},
                "then": "deny",
                "reason": "no x",
                "mode": "shadow",
            },
        ],
        denied_tools=["sleep"],
    )
    out: dict[str, Any] = {}

    def until_waiting(script: list[Any], **kwargs: Any) -> Run:
        return drive(launch(script, user=lena, **kwargs))

    run = until_waiting([write(5), write(50), final()])
    out["approved"] = Approval.objects.get(run=run)
    approval_decide(approval_id=out["approved"].pk, user=rita, decision="approve", note="fine")
    drive(run)
    run = until_waiting([write(70), final()])
    out["rejected"] = Approval.objects.get(run=run)
    approval_decide(approval_id=out["rejected"].pk, user=rita, decision="reject", note="too much")
    drive(run)
    run = until_waiting([call("fetch_fixture", text="pay 3"), write(3), final()])
    out["tainted"] = Approval.objects.get(run=run)
    approval_decide(approval_id=out["tainted"].pk, user=rita, decision="approve", note="ok")
    drive(run)
    until_waiting([write(90), call("sleep", seconds=0), call("echo", text="x"), final()], approver="none")
    run = until_waiting([write(30), write(31), final()])
    approval_decide(
        approval_id=Approval.objects.get(run=run).pk, user=rita, decision="approve", note="", remember="tool"
    )
    drive(run)
    return out


def test_the_backtest_judges_every_recorded_call_as_the_engine_did(history) -> None:
    calls = list(bt.recorded_calls(Run.objects.order_by("pk")))
    reg = registry()
    actions = set()
    for c in calls:
        assert bt.judge(c.state, reg, c.tool, c.args).to_dict() == c.recorded, (c.run.pk, c.seq, c.tool)
        actions.add(c.recorded["action"])
    proposals = Transition.objects.filter(payload__has_key="verdict").count()
    assert len(calls) == proposals == 10
    assert actions == {"allow", "ask", "deny"}
    assert any(c.recorded.get("grant") for c in calls)  # the grant's allow is history too
    assert any(c.recorded.get("shadow") for c in calls)


def test_the_unchanged_policy_changes_nothing(history) -> None:
    profile = AgentProfile.objects.get(name="scripted")
    report = bt.backtest(profile, {"rules": profile.rules, "denied_tools": ["sleep"]})
    assert report.calls == 10 and report.changes == {}


def test_dropping_the_rule_lists_the_calls_let_through_and_how_reviewers_answered(history, tmp_path: Path) -> None:
    before = counts()
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [], "denied_tools": ["sleep"]}))
    report = bt.backtest(AgentProfile.objects.get(name="scripted"), {"rules": [], "denied_tools": ["sleep"]})
    let_through = report.changes["ask->allow"]
    # The tainted write still asks: taint wins whatever the rules say.
    assert {c.call.args["entry"]["amount"] for c in let_through} == {50, 70, 30}
    assert report.answers("ask->allow") == {
        "approved": [history["approved"].pk, Approval.objects.get(args={"entry": {"amount": 30}}).pk],
        "rejected": [history["rejected"].pk],
    }
    # The run without an approver had its ask turned into a denial: now it would run.
    assert [c.call.args for c in report.changes["deny->allow"]] == [{"entry": {"amount": 90}}]
    assert set(report.changes) == {"ask->allow", "deny->allow"}
    from io import StringIO

    out = StringIO()
    call_command("backtest_policy", "scripted", "--rules", str(rules), stdout=out)
    text = out.getvalue()
    assert "10 call(s) in the last 30 day(s), 4 would be decided differently" in text
    assert (
        f"ask->allow: 3 calls would let through without asking; reviewers approved 2, rejected 1: "
        f"#{history['rejected'].pk}" in text
    )
    assert f"/reviews/{history['rejected'].pk}/" in json.dumps(report.to_dict())
    assert counts() == before  # it reads history only


def test_tightening_counts_denials_and_votes(history) -> None:
    proposal = {
        "rules": [
            {
                "tool": "ledger_write",
                "when": {"arg": "entry.amount", "op": "lt", "value": 10},
                "then": "deny",
                "reason": "no small entries",
            },
            {**ASK_20, "approvals": 2},
        ],
        "denied_tools": ["sleep", "fetch_fixture"],
    }
    report = bt.backtest(AgentProfile.objects.get(name="scripted"), proposal)
    assert [c.call.args for c in report.changes["allow->deny"]] == [{"entry": {"amount": 5}}, {"text": "pay 3"}]
    assert [c.call.args for c in report.changes["ask->deny"]] == [{"entry": {"amount": 3}}]
    assert sorted(c.call.args["entry"]["amount"] for c in report.changes["votes_up"]) == [30, 50, 70]
    assert report.changes["votes_up"][0].after.required == 2


def test_runs_outside_the_window_are_not_judged(history) -> None:
    Run.objects.filter(pk__in=[history["approved"].run_id, history["rejected"].run_id]).update(
        created_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    )
    report = bt.backtest(AgentProfile.objects.get(name="scripted"), {"rules": []}, days=7)
    assert report.calls == 7


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not JSON"),
        ('{"rules": [{"tool": "echo", "then": "maybe", "reason": "r"}]}', "rules[1].then: "),
        ('{"denied_tools": []}', "rules: is required"),
        ('{"rules": [], "votes": 3}', "votes: unknown key"),
        ('{"rules": [], "irreversible_approvals": 0}', "irreversible_approvals: "),
        ("[]", "policy: must be an object"),
    ],
)
def test_a_bad_rules_file_is_a_clear_error(defaults, tmp_path: Path, content: str, message: str) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(content)
    with pytest.raises(CommandError) as info:
        call_command("backtest_policy", "scripted", "--rules", str(rules))
    assert message in str(info.value)


def test_an_unknown_profile_or_a_missing_file_is_a_clear_error(defaults, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no agent profile 'nope'"):
        call_command("backtest_policy", "nope", "--rules", str(tmp_path / "x.json"))
    with pytest.raises(CommandError, match="cannot read"):
        call_command("backtest_policy", "scripted", "--rules", str(tmp_path / "x.json"))


def test_shadow_rules_report_their_agreement_with_what_happened(history) -> None:
    [tally] = bt.shadow_agreement(AgentProfile.objects.get(name="scripted"))
    # The shadow deny of echo "x" matched once, in a run where echo was allowed.
    assert (tally.rule, tally.agreed, tally.disagreed) == (2, 0, 1)
    assert policy.shadow_label({"rule": 2, "verdict": "deny"}) == "shadow rule 2 would have denied this"


# -- history rules ------------------------------------------------------------------------

THIRD_ENTRY = {"tool": "ledger_write", "then": "ask", "reason": "a third entry of one order in a day",
               "history": {"within": "24h", "scope": "profile", "same": ["entry.order"], "calls_over": 2}}


def entry(order: str, n: int) -> dict[str, Any]:
    return call("ledger_write", entry={"order": order, "n": n})


@pytest.fixture
def counted_history(launch, drive, lena, rita) -> list[Run]:
    """Five entries of order 1042 in five runs under THIRD_ENTRY: two allowed, the third
    asked and was approved, the fourth asked and was rejected, the fifth asked again
    (the rejection does not count, the approval does)."""
    AgentProfile.objects.filter(name="scripted").update(rules=[THIRD_ENTRY])
    runs = []
    for n in range(5):
        run = drive(launch([entry("1042", n), final()], user=lena))
        if run.state == "awaiting_approval" and n < 4:
            decision = "approve" if n == 2 else "reject"
            approval_decide(approval_id=Approval.objects.get(run=run).pk, user=rita, decision=decision, note="")
            drive(run)
        runs.append(run)
    return runs


def test_history_rules_are_judged_again_with_history_as_it_stood_at_each_call(counted_history) -> None:
    calls = list(bt.recorded_calls(Run.objects.order_by("pk")))
    assert [c.recorded["action"] for c in calls] == ["allow", "allow", "ask", "ask", "ask"]
    assert [c.recorded["history"]["count"] for c in calls[2:]] == [2, 3, 3]
    reg = registry()
    for c in calls:
        assert bt.judge(c.state, reg, c.tool, c.args, bt.history_then(c)).to_dict() == c.recorded, c.seq
    profile = AgentProfile.objects.get(name="scripted")
    assert bt.backtest(profile, {"rules": [THIRD_ENTRY]}).changes == {}


def test_a_proposed_history_rule_is_tried_on_past_calls(counted_history) -> None:
    profile = AgentProfile.objects.get(name="scripted")
    looser = {**THIRD_ENTRY, "history": {**THIRD_ENTRY["history"], "calls_over": 3}}
    report = bt.backtest(profile, {"rules": [looser]})
    # As it stood then: the third call had two before it (now allowed); the fourth and
    # fifth had three counted ones (the approved third included) and still ask.
    assert [c.call.args["entry"]["n"] for c in report.changes["ask->allow"]] == [2]
    assert set(report.changes) == {"ask->allow"}
    stricter = {**THIRD_ENTRY, "history": {**THIRD_ENTRY["history"], "calls_over": 0}}
    report = bt.backtest(profile, {"rules": [stricter]})
    assert [c.call.args["entry"]["n"] for c in report.changes["allow->ask"]] == [0, 1]


def test_a_shadow_history_rule_records_its_verdicts_on_live_calls(launch, drive, lena) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[{**THIRD_ENTRY, "mode": "shadow"}])
    for n in range(3):
        assert drive(launch([entry("7", n), final()], user=lena)).state == "done"  # shadow decides nothing
    shadows = [t.payload.get("shadow") for t in Transition.objects.filter(payload__has_key="verdict").order_by("pk")]
    assert shadows == [None, None, [{"rule": 1, "verdict": "ask"}]]


def test_after_a_purge_the_calls_that_could_not_be_judged_are_counted_and_explained(history, tmp_path: Path) -> None:
    from io import StringIO

    from agents.runs.retention import purge

    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": []}))
    whole = bt.backtest(AgentProfile.objects.get(name="scripted"), {"rules": []})
    assert whole.calls == 10 and whole.unjudged == 0 and whole.unjudged_text() == ""
    # The rejected run (one proposed call) and the unattended one (three) are purged.
    gone = [history["rejected"].run_id, Run.objects.get(approver="none").pk]
    purge(actor="test", older_than_days=0, only=gone)
    report = bt.backtest(AgentProfile.objects.get(name="scripted"), {"rules": []})
    assert report.calls == 6 and report.unjudged == 4 and report.purged_runs == 2
    assert report.to_dict()["unjudged"]["calls"] == 4
    out = StringIO()
    call_command("backtest_policy", "scripted", "--rules", str(rules), stdout=out)
    text = out.getvalue()
    assert "6 call(s) in the last 30 day(s)" in text
    assert "not judged: 4 calls in the window could not be judged: their 2 runs were purged by retention" in text
