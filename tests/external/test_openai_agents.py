"""An unchanged OpenAI Agents SDK agent governed through the Python client: the real
`openai-agents` package, in its own virtual environment (its import name `agents` is
our Django app's), against the live server and a fake model speaking the real Chat
Completions wire format. Its tool call waits in the review queue, a reviewer approves
it, the agent gets the result, and the run's journal holds the call once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.actions.tokens import token_create
from agents.models import AgentProfile, Approval, Run, ToolCall
from tests.external.sdk import venv
from tests.llm.provider import FakeProvider, Reply
from tests.llm.shapes import openai_completion

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("sdk") / "openai_agent.py"
ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}
CALL = {"customer": "ACME", "note": "called about the renewal"}


def sdk_agent(
    live_server: Any, provider: FakeProvider, token: str, tmp_path: Path, mode: str
) -> subprocess.Popen[str]:
    """The agent script in the SDK's environment, run from an empty folder with only the
    client on its path: Airlock's own `agents` package cannot be imported there."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(ROOT / "clients" / "python"), "AIRLOCK_URL": live_server.url, "AIRLOCK_TOKEN": token,
        "AIRLOCK_AGENT": "ext", "OPENAI_BASE_URL": f"{provider.url}/v1", "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "AIRLOCK_GATE_MODE": mode,
    }
    return subprocess.Popen(
        [str(venv.python()), str(SCRIPT)], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def pending_approval(run_id: int, agent: subprocess.Popen[str], *, within: float = 120) -> Approval:
    """The run's pending approval once the agent's call reaches Airlock (bounded)."""
    give_up = time.monotonic() + within
    while time.monotonic() < give_up:
        approval = Approval.objects.filter(run_id=run_id, status="pending").first()
        if approval is not None:
            return approval
        if agent.poll() is not None:
            pytest.fail(f"the agent ended before its call was held: {agent.communicate()}")
        time.sleep(0.1)
    agent.kill()
    pytest.fail(f"no approval within {within} s: {agent.communicate()}")


def held_then_decided(
    live_server: Any, provider: FakeProvider, users: dict[str, User], tmp_path: Path, mode: str, **decision: Any
) -> tuple[int, dict[str, Any]]:
    """Run the agent; once its call waits in the review queue (checked), rita decides it.
    Returns the run's id and the agent's last line."""
    _token, raw = token_create(user=users["lena"])
    agent = sdk_agent(live_server, provider, raw, tmp_path, mode)
    try:
        first = agent.stdout.readline() if agent.stdout else ""
        assert first, f"the agent printed nothing: {agent.communicate()}"
        run_id = json.loads(first)["run"]

        # The call is in the review queue, exactly as the model made it, and on the timeline.
        approval = pending_approval(run_id, agent)
        assert (approval.tool, approval.args) == ("crm_update", CALL)
        run = Run.objects.get(pk=run_id)
        assert run.state == "awaiting_approval"
        assert ("planning", "awaiting_approval") in set(run.transitions.values_list("from_state", "to_state"))
        assert not ToolCall.objects.filter(run=run, status="succeeded").exists()

        approval_decide(approval_id=approval.pk, user=users["rita"], **decision)
        out, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert agent.returncode == 0, err
    return run_id, json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def held_crm(profile: AgentProfile) -> AgentProfile:
    """`ext` asking a human for every crm_update."""
    AgentProfile.objects.filter(pk=profile.pk).update(rules=[ASK_CRM])
    return profile


@pytest.mark.parametrize("mode", ["block", "interrupt"])
def test_an_unchanged_sdk_agents_tool_call_waits_for_a_reviewer_and_runs_once(
    live_server: Any, provider: FakeProvider, held_crm: AgentProfile, users: dict[str, User], tmp_path: Path,
    mode: str,
) -> None:
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_1", "crm_update", CALL)], usage=(120, 30))),
        Reply(body=openai_completion(content="ACME is followed up.", usage=(180, 12))),
    )
    run_id, outcome = held_then_decided(
        live_server, provider, users, tmp_path, mode, decision="approve", note="fine"
    )
    # The tool ran once, in the agent's process, and the model was given its result.
    # `interrupt`: the SDK's needs_approval stopped the run once and settle() resumed it.
    assert outcome == {"final": "ACME is followed up.", "ran": [CALL], "state": "done",
                       "interrupted": int(mode == "interrupt")}
    tool_message = [m for m in provider.requests[1].json["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_message] == ["updated ACME: called about the renewal"]

    # The run's journal shows the call once, with the client's result; the usage counted.
    run = Run.objects.get(pk=run_id)
    assert (run.state, run.answer) == ("done", "ACME is followed up.")
    calls = list(ToolCall.objects.filter(run=run))
    assert [(c.tool, c.status) for c in calls] == [("crm_update", "succeeded")]
    assert calls[0].result == {"ok": True, "result": "updated ACME: called about the renewal"}
    assert run.transitions.filter(kind="tool").count() == 1
    assert run.tokens == 120 + 30 + 180 + 12


@pytest.mark.parametrize("mode", ["block", "interrupt"])
def test_a_rejected_call_never_runs_and_the_model_reads_the_reviewers_note(
    live_server: Any, provider: FakeProvider, held_crm: AgentProfile, users: dict[str, User], tmp_path: Path,
    mode: str,
) -> None:
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_1", "crm_update", CALL)])),
        Reply(body=openai_completion(content="I could not update ACME.")),
    )
    run_id, outcome = held_then_decided(
        live_server, provider, users, tmp_path, mode, decision="reject", note="ACME asked not to be called"
    )
    assert outcome == {"final": "I could not update ACME.", "ran": [], "state": "done",
                       "interrupted": int(mode == "interrupt")}
    tool_message = [m for m in provider.requests[1].json["messages"] if m["role"] == "tool"]
    assert len(tool_message) == 1 and "ACME asked not to be called" in tool_message[0]["content"]
    assert not ToolCall.objects.filter(run_id=run_id, status="succeeded").exists()
    assert Approval.objects.get(run_id=run_id).status == "rejected"


def test_parallel_tool_calls_are_proposed_one_after_the_other_and_each_runs_once(
    live_server: Any, provider: FakeProvider, profile: AgentProfile, users: dict[str, User], tmp_path: Path
) -> None:
    """The model asks for two calls at once; the SDK runs them concurrently. Airlock
    takes one call of a run at a time (a second one while the first is unreported is a
    409 call_pending): the gate queues them, so both are allowed, run and journalled."""
    other = {"customer": "Globex", "note": "sent the quote"}
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_1", "crm_update", CALL), ("call_2", "crm_update", other)])),
        Reply(body=openai_completion(content="Both updated.")),
    )
    _token, raw = token_create(user=users["lena"])
    agent = sdk_agent(live_server, provider, raw, tmp_path, "block")
    out, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["final"] == "Both updated." and sorted(outcome["ran"], key=str) == sorted([CALL, other], key=str)
    run_id = json.loads(out.strip().splitlines()[0])["run"]
    calls = ToolCall.objects.filter(run_id=run_id).order_by("id")
    assert sorted((c.args["customer"], c.status) for c in calls) == [("ACME", "succeeded"), ("Globex", "succeeded")]


@pytest.mark.parametrize("mode", ["block", "interrupt"])
def test_a_reviewers_edit_is_what_the_sdk_agents_tool_runs(
    live_server: Any, provider: FakeProvider, held_crm: AgentProfile, users: dict[str, User], tmp_path: Path,
    mode: str,
) -> None:
    edited = {"customer": "ACME", "note": "called about the renewal (no discount)"}
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_1", "crm_update", CALL)])),
        Reply(body=openai_completion(content="ACME is followed up.")),
    )
    run_id, outcome = held_then_decided(live_server, provider, users, tmp_path, mode, decision="approve", args=edited)
    assert outcome["ran"] == [edited]
    # The model is told what really ran (the journal keeps the tool's own output).
    tool_message = [m for m in provider.requests[1].json["messages"] if m["role"] == "tool"]
    assert "a reviewer changed the arguments" in tool_message[0]["content"]
    assert edited["note"] in tool_message[0]["content"]
    call = ToolCall.objects.get(run_id=run_id, status="succeeded")
    assert (call.args, call.result) == (edited, {"ok": True, "result": f"updated ACME: {edited['note']}"})


@pytest.mark.parametrize("mode", ["block", "interrupt"])
def test_two_held_parallel_calls_are_each_reviewed_and_run_once(
    live_server: Any, provider: FakeProvider, held_crm: AgentProfile, users: dict[str, User], tmp_path: Path,
    mode: str,
) -> None:
    """Two calls at once, both held: Airlock shows one at a time (the second waits for the
    first to run), each gets its own approval, and each runs once after it."""
    other = {"customer": "Globex", "note": "sent the quote"}
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_1", "crm_update", CALL), ("call_2", "crm_update", other)])),
        Reply(body=openai_completion(content="Both updated.")),
    )
    _token, raw = token_create(user=users["lena"])
    agent = sdk_agent(live_server, provider, raw, tmp_path, mode)
    try:
        run_id = json.loads(agent.stdout.readline() if agent.stdout else "{}")["run"]
        seen = []
        for _ in range(2):
            approval = pending_approval(run_id, agent)
            seen.append(approval.args["customer"])
            approval_decide(approval_id=approval.pk, user=users["rita"], decision="approve")
        out, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert agent.returncode == 0, err
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["ran"] == [CALL, other] and seen == ["ACME", "Globex"]
    calls = ToolCall.objects.filter(run_id=run_id).order_by("id")
    assert [(c.args["customer"], c.status) for c in calls] == [("ACME", "succeeded"), ("Globex", "succeeded")]
