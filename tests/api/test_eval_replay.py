"""Evals that never touch live systems: strict replay, trajectories, invariants, --policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.management.evals import invariant_problems, trajectory_problems
from agents.models import AgentProfile, LedgerEntry, Run
from tests.api.test_commands import run_command
from tests.helpers import call, final

pytestmark = pytest.mark.django_db

WRITE = {
    "tool": "ledger_write",
    "args": {"entry": "pay ACME 100"},
    "result": {"ok": True, "result": {"recorded": True}},
}


def case(**fields: Any) -> dict[str, Any]:
    return {
        "agent": "scripted", "task": "pay ACME", "approver": "human",
        "script": [call("ledger_write", entry="pay ACME 100"), final("paid")],
        "tool_results": [WRITE],
        "expect": {"state": "done", "answer": "paid"},
        **fields,
    }  # fmt: skip


def evals(tmp_path: Path, *cases: dict[str, Any], extra: tuple[str, ...] = ()) -> tuple[int, str]:
    for i, c in enumerate(cases):
        (tmp_path / f"case{i}.json").write_text(json.dumps(c))
    return run_command("run_evals", *extra, str(tmp_path))


def test_a_replayed_case_returns_the_recorded_result_and_writes_nothing(defaults, tmp_path) -> None:
    code, out = evals(tmp_path, case(expect={"state": "done", "answer": "paid", "ledger_entries": 1}))
    assert code == 0, out
    code, out = run_command("run_evals", "--keep", str(tmp_path / "case0.json"))
    assert code == 0, out
    run = Run.objects.get(task="pay ACME")
    assert not LedgerEntry.objects.exists()  # the recorded result came back; nothing ran
    [journal] = run.tool_calls.all()
    assert journal.result == {"ok": True, "result": {"recorded": True}}


def test_live_tools_only_when_the_case_asks(defaults, tmp_path) -> None:
    code, out = evals(tmp_path, case(tools="live"))
    assert code == 0, out
    code, out = run_command("run_evals", "--keep", str(tmp_path / "case0.json"))
    assert code == 0, out
    assert LedgerEntry.objects.count() == 1


def test_a_call_the_case_did_not_record_fails_it_naming_the_call(defaults, tmp_path) -> None:
    code, out = evals(tmp_path, case(tool_results=[]))
    assert code == 1, out
    assert 'strict replay: the case recorded no result for ledger_write {"entry":"pay ACME 100"}' in out
    assert not LedgerEntry.objects.exists()


def test_a_recorded_call_never_made_fails_the_case_naming_it(defaults, tmp_path) -> None:
    other = {"tool": "echo", "args": {"text": "hi"}, "result": {"ok": True, "result": "hi"}}
    code, out = evals(tmp_path, case(tool_results=[WRITE, other]))
    assert code == 1, out
    assert 'strict replay: the recorded call echo {"text":"hi"} was never made' in out


def test_a_bad_tools_value_is_a_failed_case_not_a_crash(defaults, tmp_path) -> None:
    code, out = evals(tmp_path, case(tools="sometimes"))
    assert code == 1 and '"tools" is "live" or "replay", not \'sometimes\'' in out


@pytest.mark.parametrize(
    "mode, calls, problem",
    [
        ("strict", [{"tool": "echo"}, {"tool": "ledger_write"}], None),
        ("strict", [{"tool": "ledger_write"}, {"tool": "echo"}], "trajectory (strict): the agent called echo"),
        ("strict", [{"tool": "echo", "args": {"text": "other"}}, {"tool": "ledger_write"}], "trajectory (strict)"),
        ("unordered", [{"tool": "ledger_write"}, {"tool": "echo", "args": {"text": "look"}}], None),
        ("unordered", [{"tool": "ledger_write"}], "calls not in the reference: echo"),
        ("subset", [{"tool": "ledger_write"}, {"tool": "echo"}, {"tool": "fetch_fixture"}], None),
        ("subset", [{"tool": "ledger_write"}], "trajectory (subset): calls not in the reference: echo"),
        ("superset", [{"tool": "ledger_write"}], None),
        (
            "superset",
            [{"tool": "ledger_write"}, {"tool": "sleep"}],
            "trajectory (superset): expected calls not made: sleep",
        ),
    ],
)
def test_trajectory_match_modes(
    defaults, tmp_path, mode: str, calls: list[dict[str, Any]], problem: str | None
) -> None:
    echo = {"tool": "echo", "args": {"text": "look"}, "result": {"ok": True, "result": "look"}}
    c = case(
        script=[call("echo", text="look"), call("ledger_write", entry="pay ACME 100"), final("paid")],
        tool_results=[echo, WRITE],
        expect={"state": "done", "answer": "paid", "calls": {"mode": mode, "calls": calls}},
    )
    code, out = evals(tmp_path, c)
    if problem is None:
        assert code == 0, out
    else:
        assert code == 1 and problem in out, out


def test_a_malformed_trajectory_check_is_a_failed_case(defaults, tmp_path) -> None:
    code, out = evals(tmp_path, case(expect={"state": "done", "calls": {"mode": "roughly", "calls": []}}))
    assert code == 1 and "expect.calls must be" in out


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_invariants_name_the_one_a_run_breaks(defaults, launch, drive) -> None:
    run = drive(launch([call("ledger_write", entry="once"), final("ok")]))
    assert invariant_problems(run) == []
    assert trajectory_problems(run, {"mode": "strict", "calls": [{"tool": "ledger_write"}]}) == []
    journal = run.tool_calls.get()
    key = journal.idempotency_key
    # Forge what the engine never does: the call executed a second time, an effect with
    # no intent row, a tool transition without a journal row, a step past the budget.
    LedgerEntry.objects.create(run=run, idempotency_key="f" * 64, entry="no intent")
    last = run.transitions.order_by("-seq").first()
    run.transitions.create(
        seq=last.seq + 1,
        from_state="acting",
        to_state="planning",
        kind="tool",
        payload={"call": {"id": "ghost", "tool": "echo"}, "ok": True},
        actor="test",
    )
    run.transitions.create(
        seq=last.seq + 2,
        from_state="acting",
        to_state="planning",
        kind="tool",
        payload={"call": {"id": journal.call_id, "tool": "ledger_write"}, "ok": True},
        actor="test",
    )
    Run.objects.filter(pk=run.pk).update(steps=999)
    run.refresh_from_db()
    problems = invariant_problems(run)
    assert f"invariant one_execution_per_key: key {key[:12]}... executed 2 times" in problems
    assert "invariant intent_before_effect: a ledger entry names key ffffffffffff... with no intent row" in problems
    assert f"invariant intent_before_effect: transition {last.seq + 1} ran ghost with no journal row" in problems
    assert any(p.startswith("invariant budget: steps 999 over the run's max_steps") for p in problems)


def test_run_evals_policy_lists_the_cases_whose_verdicts_change(defaults, tmp_path) -> None:
    ask = {"tool": "ledger_write", "then": "ask", "reason": "every entry needs a human"}
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [ask]}))
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "pays.json").write_text(json.dumps(case()))
    reads = case(
        script=[call("echo", text="x"), final("paid")],
        tool_results=[{"tool": "echo", "args": {"text": "x"}, "result": {"ok": True, "result": "x"}}],
    )
    (cases / "reads.json").write_text(json.dumps(reads))
    before = AgentProfile.objects.get(name="scripted").rules
    code, out = run_command("run_evals", "--policy", str(policy), str(cases))
    assert code == 0, out  # the cases pass as they stand
    assert f"{cases / 'pays.json'}: verdicts change\n    - call 1 ledger_write: allow -> ask" in out
    assert "reads.json: verdicts change" not in out
    assert "run_evals --policy: 1 of 2 case(s) change verdicts" in out
    assert AgentProfile.objects.get(name="scripted").rules == before  # tried, never kept
    assert not Run.objects.exists()


def test_run_evals_policy_refuses_a_bad_file_and_keep(defaults, tmp_path) -> None:
    from django.core.management import CommandError, call_command

    (tmp_path / "case.json").write_text(json.dumps(case()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"tool": "x", "then": "maybe", "reason": "r"}]}))
    with pytest.raises(CommandError, match=r"rules\[1\]\.then"):
        call_command("run_evals", "--policy", str(bad), str(tmp_path / "case.json"))
    with pytest.raises(CommandError, match="cannot be combined with --keep"):
        call_command("run_evals", "--policy", str(bad), "--keep", str(tmp_path / "case.json"))
