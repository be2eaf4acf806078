"""Saved runs with votes, edits and expiries replay as evals (`run_evals`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from agents.actions.approvals import approval_decide, approval_expire
from agents.defaults import DIAGNOSTIC_TOOLS
from agents.models import AgentProfile, Approval, LedgerEntry, Run
from tests.api.test_commands import run_command
from tests.helpers import call, final, person

pytestmark = pytest.mark.django_db(transaction=True)

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("paid")]


def export(run: Run, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / f"run{run.pk}.json"
    code, _ = run_command("export_run", str(run.pk), "--output", str(path))
    assert code == 0
    return json.loads(path.read_text())


def replay(case: dict[str, Any], tmp_path: Path) -> tuple[int, str, Run]:
    case = {**case, "task": f"replay of {case['task']}"}
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    code, out = run_command("run_evals", "--keep", str(path))
    return code, out, Run.objects.get(task=case["task"])


def test_an_edited_two_person_approval_replays_with_the_same_votes(defaults, launch, drive, tmp_path) -> None:
    rita, rob = person("rita", "reviewer"), person("rob", "reviewer")
    run = drive(launch(SCRIPT, task="edited", policy={"rules": [TWO_PEOPLE]}))
    approval = Approval.objects.pending().get(run=run)
    edited = approval_decide(
        approval_id=approval.pk, user=rob, decision="approve", args={"entry": "pay ACME 90"}, note="90"
    ).approval
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", args_hash=edited.args_hash)
    run = drive(run)
    case = export(run, tmp_path)
    [d] = case["decisions"]
    assert d["edited_args"] == {"entry": "pay ACME 90"} and d["required"] == 2
    assert [(v["by"], v["decision"]) for v in d["votes"]] == [("rob", "approve"), ("rita", "approve")]
    assert case["policy"]["rules"] == [TWO_PEOPLE]

    code, out, again = replay(case, tmp_path)
    assert code == 0, out
    # Strict replay matched the recorded result to the edited call; nothing was written.
    assert [(c.args, c.status) for c in again.tool_calls.all()] == [({"entry": "pay ACME 90"}, "succeeded")]
    assert not LedgerEntry.objects.filter(run=again).exists()
    replayed = Approval.objects.get(run=again)
    assert replayed.edited_args == {"entry": "pay ACME 90"}
    assert [v.by_name for v in replayed.current_votes()] == ["rob", "rita"]

    # One vote short: the replay says the votes no longer decide.
    d["votes"] = d["votes"][:1]
    code, out, _ = replay({**case, "task": "short"}, tmp_path)
    assert code == 1 and "do not decide the replayed approval (it needs 2)" in out


def test_an_expired_approval_replays_as_an_expiry_not_a_rejection(defaults, launch, drive, tmp_path) -> None:
    run = drive(launch(SCRIPT, task="expired", policy={"rules": [TWO_PEOPLE], "approval_timeout_seconds": 30}))
    approval = Approval.objects.pending().get(run=run)
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=time.time() + 31)
    run = drive(run)
    case = export(run, tmp_path)
    assert case["decisions"][0]["expired"] and case["decisions"][0]["status"] == "expired"

    code, out, again = replay(case, tmp_path)
    assert code == 0, out
    assert again.state == "done" and Approval.objects.get(run=again).status == "expired"
    assert not LedgerEntry.objects.filter(run=again).exists()


def test_an_expiry_that_failed_the_run_replays_as_a_failure(defaults, launch, drive, tmp_path) -> None:
    AgentProfile.objects.create(
        name="strict", provider="scripted", model_name="script", tools=DIAGNOSTIC_TOOLS, separate_duties=False,
        on_expiry="fail", approval_timeout_seconds=30,
    )
    run = drive(launch(SCRIPT, agent="strict", task="failed", policy={"rules": [TWO_PEOPLE]}))
    approval = Approval.objects.pending().get(run=run)
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=time.time() + 31)
    case = export(Run.objects.get(pk=run.pk), tmp_path)
    assert case["expect"]["state"] == "failed"

    code, out, again = replay(case, tmp_path)
    assert code == 0, out
    assert again.state == "failed" and again.error == "no reviewer answered within 30 s"
