"""History rules on external runs, through the decision API (`POST /api/runs/<id>/calls`):
the same judge, the figures in the answer, and exact counts under concurrency."""

from __future__ import annotations

from typing import Any

import pytest

from agents.actions import external
from agents.models import AgentProfile, Approval, LedgerEntry, Run, ToolCall
from tests.helpers import at_once, requires_postgres

pytestmark = pytest.mark.django_db(transaction=True)

THIRD = {"tool": "ledger_write", "then": "ask", "reason": "a third entry of one order in a day",
         "history": {"within": "24h", "scope": "profile", "same": ["entry.order"], "calls_over": 2}}
AFTER_READ = {"tool": "crm_update", "then": "ask", "reason": "writes after reading outside text",
              "history": {"scope": "run", "after": ["fetch_fixture"]}}


def propose(api: Any, run_id: int, tool: str, who: str = "lena", **args: Any) -> Any:
    response = api(who).post(f"/api/runs/{run_id}/calls", {"tool": tool, "args": args})
    assert response.status_code in (200, 201), response.data
    return response.data


def test_a_third_call_of_one_order_across_external_runs_waits_with_the_figures(api, external_run, profile) -> None:
    AgentProfile.objects.filter(pk=profile.pk).update(rules=[THIRD])
    for amount in (1, 2):
        done = propose(api, external_run(), "ledger_write", entry={"order": "1042", "amount": amount})
        assert done["verdict"] == "allow"
    assert propose(api, external_run(), "ledger_write", entry={"order": "77", "amount": 3})["verdict"] == "allow"
    held = propose(api, external_run(), "ledger_write", entry={"order": "1042", "amount": 4})
    assert (held["verdict"], held["status"]) == ("ask", "pending")
    assert held["reason"] == (
        "a third entry of one order in a day: the 3rd ledger_write call with entry.order 1042 in 24 h (over 2)"
    )
    assert held["approval"]["history"]["count"] == 2
    assert LedgerEntry.objects.count() == 3


def test_after_holds_a_client_tool_once_the_run_read_outside_text(api, external_run, profile) -> None:
    AgentProfile.objects.filter(pk=profile.pk).update(rules=[AFTER_READ])
    run_id = external_run()
    assert propose(api, run_id, "crm_update", customer="A", note="n")["verdict"] == "allow"
    key = ToolCall.objects.get(run_id=run_id, tool="crm_update").idempotency_key
    assert api("lena").post(f"/api/runs/{run_id}/calls/{key}/result", {"ok": True, "output": "ok"}).status_code == 200
    propose(api, run_id, "fetch_fixture", text="a page")
    held = propose(api, run_id, "crm_update", customer="B", note="n")
    assert held["verdict"] == "ask" and held["approval"]["history"]["ran"] == "fetch_fixture"


def test_a_launch_may_add_a_history_rule_to_an_external_run(api, external_run) -> None:
    limit = {"tool": "echo", "then": "deny", "reason": "one echo per run",
             "history": {"scope": "run", "calls_over": 1}}
    run_id = external_run(policy={"rules": [limit]})
    assert propose(api, run_id, "echo", text="a")["verdict"] == "allow"
    denied = propose(api, run_id, "echo", text="b")
    assert (denied["verdict"], denied["status"]) == ("deny", "denied")
    bad = api("lena").post("/api/runs", {"agent": "ext", "task": "t", "policy": {
        "rules": [{**limit, "history": {"scope": "caller", "calls_over": 1}}]}})
    assert bad.status_code == 400 and bad.data["detail"].startswith("policy.rules[1].history.within: ")


@requires_postgres()  # the advisory locks that serialise the count are PostgreSQL's
def test_twelve_external_runs_proposing_at_once_let_exactly_three_through(api, external_run, profile, lena) -> None:
    rule = {"tool": "ledger_write", "then": "ask", "reason": "three entries an hour",
            "history": {"within": "1h", "scope": "profile", "calls_over": 3}}
    AgentProfile.objects.filter(pk=profile.pk).update(rules=[rule])
    ids = [external_run() for _ in range(12)]

    def go(run_id: int) -> str:
        answer = external.call_propose(run_id=run_id, tool="ledger_write", args={"entry": f"e{run_id}"}, user=lena)
        return answer.verdict

    verdicts = at_once(go, ids)
    assert sorted(verdicts) == ["allow"] * 3 + ["ask"] * 9
    assert LedgerEntry.objects.count() == 3
    assert Approval.objects.filter(status="pending").count() == 9
    assert min(a.history["count"] for a in Approval.objects.all()) == 3
    assert Run.objects.filter(state="awaiting_approval").count() == 9


@requires_postgres()  # the figures ride a pipeline of prepared statements
def test_the_figures_are_read_once_under_their_locks_ahead_of_the_judgement(
    api, external_run, profile, monkeypatch
) -> None:
    """A proposal reads its history rules' figures (and takes their locks) once, after
    the run's lock and ahead of the judgement, which asks no further read."""
    from agents.runs.history import StoreHistory

    AgentProfile.objects.filter(pk=profile.pk).update(rules=[THIRD])
    for amount in (1, 2):
        assert propose(api, external_run(), "ledger_write", entry={"order": "1042", "amount": amount})["verdict"] == "allow"
    reads: list[Any] = []
    read = StoreHistory.all_at_once
    monkeypatch.setattr(StoreHistory, "all_at_once", lambda self, *a, **k: reads.append(k) or read(self, *a, **k))
    held = propose(api, external_run(), "ledger_write", entry={"order": "1042", "amount": 4})
    assert (held["verdict"], held["approval"]["history"]["count"]) == ("ask", 2)
    assert reads == [{"lock_first": True}]
    assert propose(api, external_run(), "ledger_write", entry={"order": "5", "amount": 4})["verdict"] == "allow"
    assert reads == [{"lock_first": True}] * 2


@requires_postgres()  # the figures ride the run lock's pipeline
def test_a_runs_next_proposal_reads_its_figures_in_the_run_locks_round_trip(
    api, external_run, profile, monkeypatch
) -> None:
    """Once a run has had a proposal in this process, the next one sends its history
    rules' figures (and their locks) in the run lock's round trip; the same figures,
    the same verdicts."""
    from agents.lib import prepared
    from agents.runs.history import StoreHistory

    AgentProfile.objects.filter(pk=profile.pk).update(rules=[THIRD])
    run_id = external_run()
    assert propose(api, run_id, "ledger_write", entry={"order": "1042", "amount": 1})["verdict"] == "allow"
    apart: list[Any] = []
    read = StoreHistory.all_at_once
    monkeypatch.setattr(StoreHistory, "all_at_once", lambda self, *a, **k: apart.append(a) or read(self, *a, **k))
    sent: list[int] = []
    pipelined = prepared.pipelined
    monkeypatch.setattr(prepared, "pipelined", lambda statements: sent.append(len(statements)) or pipelined(statements))
    assert propose(api, run_id, "ledger_write", entry={"order": "1042", "amount": 2})["verdict"] == "allow"
    held = propose(api, run_id, "ledger_write", entry={"order": "1042", "amount": 3})
    assert (held["verdict"], held["approval"]["history"]["count"]) == ("ask", 2)
    assert apart == []  # neither read its figures on its own
    # The run's lock; the identical-call read with the figures' locks and plan settings;
    # the figures.
    assert sent == [3, 3]


@requires_postgres()
def test_a_run_whose_policy_changed_is_judged_under_the_new_one(api, external_run, profile, monkeypatch) -> None:
    """The figures read ahead for the policy the run's last proposal saw are another
    policy's now: the proposal is made again, its figures read under the new policy."""
    from agents.actions import external as ext

    AgentProfile.objects.filter(pk=profile.pk).update(rules=[THIRD])
    run_id = external_run()
    for amount in (1, 2):
        assert propose(api, run_id, "ledger_write", entry={"order": "1042", "amount": amount})["verdict"] == "allow"
    run = Run.objects.get(pk=run_id)
    stricter = {**THIRD, "history": {**THIRD["history"], "calls_over": 1}, "reason": "a second entry of one order"}
    Run.objects.filter(pk=run_id).update(engine={**run.engine, "policy": {**run.engine["policy"], "rules": [stricter]}})
    made: list[bool] = []
    real = ext._propose
    monkeypatch.setattr(ext, "_propose", lambda **kw: made.append(kw["foresee"]) or real(**kw))
    held = propose(api, run_id, "ledger_write", entry={"order": "1042", "amount": 3})
    assert (held["verdict"], held["approval"]["history"]["count"], held["approval"]["history"]["calls_over"]) == (
        "ask", 2, 1)
    assert made == [True, False]  # foreseen under the old rule, then made again under the new
