"""The transcript is stored as appended deltas: storage grows linearly with steps."""

from __future__ import annotations

import pytest

from agents.models import AgentProfile
from agents.runs.verify import payload_bytes
from tests.helpers import call, final

pytestmark = pytest.mark.django_db(transaction=True)


def test_bytes_per_step_of_a_200_step_run_stay_within_1_5_times_a_10_step_run(launch, drive, defaults) -> None:
    AgentProfile.objects.filter(name="scripted").update(limits={"max_steps": 1000})
    per_step = {}
    for n in (10, 200):
        script = [call("echo", text=f"result {i:04d} " + "x" * 100) for i in range(n)] + [final()]
        run = drive(launch(script))
        assert run.state == "done", run.error
        per_step[n] = payload_bytes(run) / run.steps
    assert per_step[200] <= 1.5 * per_step[10], per_step
