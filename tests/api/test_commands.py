"""launch, export_run and run_evals: the commands share the API's actions."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command

from agents.models import Approval, LedgerEntry, Run
from tests.helpers import requires_postgres, tainted_write

pytestmark = pytest.mark.django_db

EVALS = Path(__file__).resolve().parents[2] / "evals"


def run_command(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=io.StringIO())
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue()


def write_script(tmp_path: Path, script: list) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return str(path)


@pytest.mark.parametrize(
    "script,approver,code,state",
    [
        ([{"final": "hello"}], "human", 0, "done"),
        ([{"call": {"tool": "echo", "args": {"text": "x"}}}], "human", 1, "failed"),  # then the script runs out
        (tainted_write(), "human", 2, "awaiting_approval"),
        (tainted_write(), "none", 0, "done"),
    ],
)
def test_launch_wait_exits_by_how_the_run_ended(defaults, tmp_path, script, approver, code, state) -> None:
    got, out = run_command(
        "launch",
        "--agent",
        "scripted",
        "--task",
        "t",
        "--script",
        write_script(tmp_path, script),
        "--approver",
        approver,
        "--wait",
        "--json",
    )
    assert got == code
    data = json.loads(out)
    assert data["state"] == state and Run.objects.get(pk=data["id"]).state == state


def test_launch_without_wait_leaves_the_run_queued(defaults, tmp_path) -> None:
    code, out = run_command(
        "launch", "--agent", "scripted", "--task", "t", "--script", write_script(tmp_path, [{"final": "x"}])
    )
    assert code == 0 and out.startswith("run ") and Run.objects.get().state == "queued"


def test_launch_refusal_is_a_command_error(defaults) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown_agent"):
        call_command("launch", "--agent", "nosuch", "--task", "t", stdout=io.StringIO())
    assert Run.objects.count() == 0


def test_launch_takes_a_tighter_policy_and_refuses_a_looser_one(defaults, tmp_path) -> None:
    from django.core.management.base import CommandError

    rule = {"tool": "echo", "then": "deny", "reason": "not in this run"}
    call_command("launch", "--agent", "scripted", "--task", "t", "--policy", json.dumps({"rules": [rule]}),
                 "--script", write_script(tmp_path, [{"final": "x"}]), stdout=io.StringIO())
    assert Run.objects.get().policy()["rules"] == [{**rule, "origin": "launch", "index": 1}]
    with pytest.raises(CommandError, match=r"invalid_policy: policy.rules\[1\].then"):
        call_command("launch", "--agent", "scripted", "--task", "t", "--policy",
                     json.dumps({"rules": [{**rule, "then": "allow"}]}), "--script",
                     write_script(tmp_path, [{"final": "x"}]), stdout=io.StringIO())
    assert Run.objects.count() == 1


def test_export_run_prints_the_timeline_download(defaults, launch, drive) -> None:
    from agents.runs.export import export_run

    run = drive(launch(tainted_write(), approver="none"))
    code, out = run_command("export_run", str(run.pk))
    assert code == 0
    assert json.loads(out) == json.loads(json.dumps(export_run(Run.objects.get(pk=run.pk))))


def test_shipped_evals_pass(defaults) -> None:
    code, out = run_command("run_evals", "--keep", str(EVALS))  # kept, to look at the runs
    assert code == 0, out
    cases = sorted(EVALS.glob("*.json"))
    assert len(cases) >= 3
    assert f"{len(cases)} case(s), {len(cases)} passed, 0 failed" in out
    # The injected page asked for an email; the eval's reviewer rejected it: nothing sent.
    injected = Run.objects.get(task="Summarise the shipping page for a customer.")
    assert Approval.objects.get(run=injected).status == "rejected"
    assert LedgerEntry.objects.filter(run=injected).count() == 0
    # Saved demo runs replay with the scripted model under the demo profile's policy:
    # the profile's rule asked about the refund and a reviewer approved it; strict
    # replay returned the recorded refund instead of paying again (issue 32).
    refund = Run.objects.get(task__startswith="My blender from order 1042")
    assert refund.profile.name == "replay-demo"
    assert Approval.objects.get(run=refund).reason == "refunds of 20 or more need a human"
    assert LedgerEntry.objects.filter(run=refund).count() == 0
    [paid] = refund.tool_calls.filter(tool="refund")
    assert paid.status == "succeeded" and paid.result["result"]["refunded"] is True


def every_row() -> dict[str, list[int]]:
    """The primary keys of every table Airlock and Django's auth keep."""
    from django.apps import apps

    models = [*apps.get_app_config("agents").get_models(), *apps.get_app_config("auth").get_models()]
    return {m._meta.label: sorted(m.objects.values_list("pk", flat=True)) for m in models}


def test_evals_leave_the_database_as_they_found_it(defaults, launch, drive) -> None:
    """Issue 25 item 9: `run_evals evals/` on a deployment filled its runs list, the
    overview and the launch form (a `replay-demo` profile). Each case now runs in a
    transaction rolled back at the end; the results are still reported."""
    from agents.models import AgentProfile

    live = drive(launch(tainted_write(), approver="none", task="a live run"))
    before = every_row()
    code, out = run_command("run_evals", str(EVALS))
    cases = len(list(EVALS.glob("*.json")))
    assert code == 0, out
    assert f"{cases} case(s), {cases} passed, 0 failed" in out
    assert every_row() == before
    assert not AgentProfile.objects.filter(name__startswith="replay-").exists()
    assert [r.pk for r in Run.objects.all()] == [live.pk]


def test_an_eval_sends_no_email(defaults, tmp_path, settings) -> None:
    """A case whose replay sends an email (a deployment's SMTP backend) sends nothing."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    case = {
        "agent": "demo", "task": "tell Sam", "approver": "human", "tools": "live",
        "script": [{"call": {"tool": "send_email", "args": {"to": "sam@example.com", "subject": "Hi", "body": "Hello"}}},
                   {"final": "told"}],
        "expect": {"state": "done", "answer": "told", "ledger_entries": 1},
    }  # fmt: skip
    (tmp_path / "case.json").write_text(json.dumps(case))
    code, out = run_command("run_evals", str(tmp_path / "case.json"))
    assert code == 0, out
    assert not (tmp_path / "mail").exists() or list((tmp_path / "mail").iterdir()) == []
    assert LedgerEntry.objects.count() == 0


def doctor(tmp_path: Path, name: str, change) -> Path:
    case = json.loads((EVALS / name).read_text())
    change(case)
    path = tmp_path / name
    path.write_text(json.dumps(case))
    return path


@pytest.mark.parametrize(
    "name,change,problem",
    [
        (
            "injected_page_email_rejected.json",
            lambda c: c["decisions"].__setitem__(0, {**c["decisions"][0], "decision": "approve"}),
            "strict replay: the case recorded no result for ledger_write",
        ),
        (
            "injected_page_email_rejected.json",
            lambda c: c.__setitem__("decisions", []),
            "ended awaiting_approval, expected done",
        ),
        (
            "helpdesk_answer_from_kb.json",
            lambda c: c["expect"].__setitem__("answer", "Ask the post office."),
            "expected 'Ask the post office.'",
        ),
        (
            "demo_planted_instruction_email_rejected.json",
            lambda c: c["decisions"].__setitem__(0, {**c["decisions"][0], "decision": "approve"}),
            "strict replay: the case recorded no result for send_email",
        ),
        (
            "demo_refund_always_asks_approved.json",
            lambda c: c["script"][0]["calls"][0]["args"].__setitem__("order_id", "1043"),
            "but refund",
        ),
        (
            "looping_agent_hits_step_budget.json",
            lambda c: c["limits"].__setitem__("max_steps", 20),
            "ended done, expected failed",
        ),
    ],
)
def test_a_doctored_case_fails(defaults, tmp_path, name, change, problem) -> None:
    shutil.copy(EVALS / "helpdesk_answer_from_kb.json", tmp_path / "good.json")
    doctor(tmp_path, name, change)
    code, out = run_command("run_evals", str(tmp_path))
    assert code == 1, out
    assert "2 case(s), 1 passed, 1 failed" in out and problem in out


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_an_exported_run_replays_as_an_eval(defaults, launch, drive, tmp_path) -> None:
    from agents.actions.approvals import approval_decide

    run = drive(launch(tainted_write(), task="exported"))
    approval_decide(approval_id=Approval.objects.get(run=run).pk, user=None, decision="approve")
    run = drive(run)
    assert run.state == "done"
    code, out = run_command("export_run", str(run.pk), "--output", str(tmp_path / "case.json"))
    code, out = run_command("run_evals", "--keep", str(tmp_path / "case.json"))
    assert code == 0, out
    replay = Run.objects.exclude(pk=run.pk).get(task="exported")
    # Strict replay: the recorded results came back, nothing was written again.
    assert replay.answer == run.answer and replay.ledger.count() == 0
    assert [(c.tool, c.result) for c in replay.tool_calls.order_by("step")] == [
        (c.tool, c.result) for c in run.tool_calls.order_by("step")
    ]


def test_eval_flags_a_risky_call_after_taint_without_approval(defaults, launch, drive) -> None:
    """The engine never lets this happen; the checker must still see it in the rows."""
    from agents.management.evals import unapproved_risky_calls

    run = drive(launch(tainted_write(), approver="none"))
    assert unapproved_risky_calls(run) == []
    # Forge a tool transition as if ledger_write had run after the taint.
    last = run.transitions.order_by("-seq").first()
    run.transitions.create(
        seq=last.seq + 1,
        from_state="acting",
        to_state="planning",
        kind="tool",
        payload={"call": {"id": "forged", "tool": "ledger_write"}, "ok": True},
        actor="test",
    )
    seq = last.seq + 1
    assert unapproved_risky_calls(run) == [f"ledger_write (write) ran after taint without approval (transition {seq})"]


def test_a_case_saved_from_another_agent_replays_under_its_policy(defaults, tmp_path) -> None:
    """A demo run's case replays with the scripted model but the demo profile's policy:
    here the profile always asks before echo, so the replay must ask too."""
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="demo").update(tools=["echo"], always_ask_tools=["echo"])
    case = {
        "agent": "demo",
        "task": "look it up",
        "approver": "human",
        "tools": "live",
        "limits": {},
        "script": [{"call": {"tool": "echo", "args": {"text": "kb"}}}, {"final": "found"}],
        "decisions": [{"tool": "echo", "decision": "approve", "note": ""}],
        "expect": {"state": "done", "answer": "found"},
    }
    (tmp_path / "demo.json").write_text(json.dumps(case))
    code, out = run_command("run_evals", "--keep", str(tmp_path))
    assert code == 0, out
    run = Run.objects.get(task="look it up")
    assert run.profile.name == "replay-demo" and run.profile.provider == "scripted"
    assert Approval.objects.get(run=run).reason == "the agent profile always asks before echo"


@requires_postgres()  # two threads writing: SQLite's in-memory test database locks
@pytest.mark.django_db(transaction=True)  # the follower's thread reads what this one commits
def test_wait_follows_a_run_a_worker_is_driving(defaults, launch) -> None:
    """When a worker holds the lease, run_settle cannot drive; it polls until the worker
    lets the run rest."""
    import threading

    from django.db import connection

    from agents.management.evals import run_settle
    from agents.runs import driver

    run = launch([{"final": "from the worker"}])
    assert driver.take_lease(run.pk, "worker:elsewhere")
    settled: list[Run] = []

    def follow() -> None:
        try:
            settled.append(run_settle(run.pk, timeout=60))
        finally:
            connection.close()

    follower = threading.Thread(target=follow)
    follower.start()
    driver.drive(run.pk, owner="worker:elsewhere")  # the "worker" finishes the run
    follower.join()
    assert settled[0].state == "done" and settled[0].answer == "from the worker"
    actors = set(Run.objects.get(pk=run.pk).transitions.exclude(kind="launch").values_list("actor", flat=True))
    assert actors == {"worker:elsewhere"}  # the follower never stepped the run itself
