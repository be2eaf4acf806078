"""An external run rests while its client thinks: no worker calls a model for it, the
sweeper does not wake it, and its deadline still ends it."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.utils import timezone

from agents import broker
from agents.models import Run
from agents.runs import driver, sweeper, worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def wakeups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runs woken (the broker is the outside world here: a worker would consume them)."""
    woken: list[int] = []
    monkeypatch.setattr(broker, "wake_run", woken.append)
    return woken


def test_a_worker_picks_an_external_run_up_and_leaves_it_resting_in_planning(external_run, wakeups) -> None:
    run_id = external_run()
    wakeups.clear()
    worker.advance(run_id, redelivered=False)
    run = Run.objects.get(pk=run_id)
    assert run.state == "planning" and run.error is None and run.lease_owner is None
    assert list(run.transitions.values_list("kind", flat=True)) == ["launch", "pickup"]
    assert wakeups == []  # resting is not "budget ran out": nothing re-enqueued
    worker.advance(run_id, redelivered=True)
    assert Run.objects.get(pk=run_id).version == run.version


def test_a_run_waiting_for_its_clients_tool_is_left_alone_by_worker_and_sweeper(api, external_run, wakeups) -> None:
    run_id = external_run()
    api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "A", "note": "n"}})
    run = Run.objects.get(pk=run_id)
    assert run.state == "acting"
    worker.advance(run_id, redelivered=False)
    assert Run.objects.get(pk=run_id).version == run.version
    # Idle for an hour: a model's run would be woken, this one waits for its client.
    Run.objects.filter(pk=run_id).update(updated_at=timezone.now() - dt.timedelta(hours=1))
    assert run_id not in driver.unattended_runs(timezone.now(), 100)
    assert sweeper.sweep()["woken"] == 0 and wakeups == []


def test_the_sweeper_fails_an_external_run_past_its_deadline(api, external_run) -> None:
    run_id = external_run(limits={"deadline_seconds": 60})
    api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "hi"}})
    Run.objects.filter(pk=run_id).update(deadline=timezone.now() - dt.timedelta(seconds=1))
    assert sweeper.sweep()["failed"] == 1
    run = Run.objects.get(pk=run_id)
    assert run.state == "failed" and "deadline" in run.error
    late = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "late"}})
    assert late.status_code == 409 and late.data["error"] == "run_ended"



def test_launch_wait_returns_once_an_external_run_rests_for_its_client(profile, lena, monkeypatch) -> None:
    from django.core.management import call_command

    from agents.management import evals

    def no_waiting(seconds: float) -> None:
        raise AssertionError("launch --wait waited for a run that only its client moves")

    monkeypatch.setattr(evals.time, "sleep", no_waiting)
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("launch", "--agent", "ext", "--task", "t", "--user", "lena", "--wait", stdout=out)
    assert exited.value.code == 3
    assert out.getvalue().startswith("run ") and ": planning" in out.getvalue()
