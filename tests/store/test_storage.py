"""The transcript is stored as appended deltas: storage grows linearly with steps."""

from __future__ import annotations

import json

import pytest

from agents.models import AgentProfile, Message, ToolCall, Transition
from tests.conftest import call, final

pytestmark = pytest.mark.django_db(transaction=True)


def stored_bytes(run) -> int:
    total = 0
    for t in Transition.objects.filter(run=run):
        total += len(json.dumps(t.payload)) + len(t.from_state) + len(t.to_state) + len(t.kind) + len(t.actor)
    for m in Message.objects.filter(run=run):
        total += len(m.content) + len(json.dumps(m.tool_calls)) + len(m.tool_call_id) + len(m.role)
    for c in ToolCall.objects.filter(run=run):
        total += len(json.dumps(c.args)) + len(json.dumps(c.result)) + len(c.idempotency_key)
    return total


def test_bytes_per_step_of_a_200_step_run_stay_within_1_5_times_a_10_step_run(launch, drive, defaults) -> None:
    AgentProfile.objects.filter(name="scripted").update(limits={"max_steps": 1000})
    per_step = {}
    for n in (10, 200):
        script = [call("echo", text=f"result {i:04d} " + "x" * 100) for i in range(n)] + [final()]
        run = drive(launch(script))
        assert run.state == "done", run.error
        per_step[n] = stored_bytes(run) / run.steps
    assert per_step[200] <= 1.5 * per_step[10], per_step
