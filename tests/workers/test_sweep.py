"""The sweeper and the poison count, in process: what they change in the database."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.utils import timezone

from agents import broker, tasks
from agents.models import Approval, Run
from agents.runs import driver
from tests.helpers import at_once, call, final, requires_postgres, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def woken(monkeypatch) -> list[int]:
    """Wake-ups the code under test sends (the broker is another test's business)."""
    sent: list[int] = []
    lock = threading.Lock()

    def record(run_id: int) -> None:
        with lock:
            sent.append(run_id)

    monkeypatch.setattr(broker, "wake_run", record)
    return sent


def make_idle(run: Run, seconds: float = 60) -> None:
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - dt.timedelta(seconds=seconds))


def test_idle_runs_and_dead_leases_are_woken_and_live_ones_left_alone(launch, woken) -> None:
    idle, expired, live, fresh = (launch([final()]) for _ in range(4))
    for run in (idle, live):
        make_idle(run)  # `expired` moved recently: its dead lease alone sends it
    past, future = timezone.now() - dt.timedelta(seconds=5), timezone.now() + dt.timedelta(seconds=60)
    Run.objects.filter(pk=expired.pk).update(lease_owner="worker:gone:1", lease_expires=past)
    Run.objects.filter(pk=live.pk).update(lease_owner="worker:busy:2", lease_expires=future)
    before = Run.objects.get(pk=idle.pk).updated_at
    woken.clear()
    assert tasks.sweep() == {"failed": 0, "expired": 0, "expiring": 0, "escalated": 0, "woken": 2, "lapsed_claims": 0, "tallied": 0}
    assert sorted(woken) == sorted([idle.pk, expired.pk])
    # Stamped: the next sweep waits another idle period before sending them again.
    assert tasks.sweep() == {"failed": 0, "expired": 0, "expiring": 0, "escalated": 0, "woken": 0, "lapsed_claims": 0, "tallied": 0}
    # The stamp is no lease: a worker takes the run at once, and the run's own
    # updated_at still says when it last moved.
    assert Run.objects.get(pk=idle.pk).updated_at == before
    assert driver.take_lease(idle.pk, "worker:new:3") and driver.take_lease(expired.pk, "worker:new:3")


def test_runs_waiting_for_a_human_or_ended_are_not_woken(launch, drive, woken) -> None:
    waiting = drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry=1), final()]))
    done = drive(launch([final()]))
    assert (waiting.state, done.state) == ("awaiting_approval", "done")
    make_idle(waiting)
    make_idle(done)
    woken.clear()
    assert tasks.sweep()["woken"] == 0 and woken == []


@requires_postgres()
def test_two_sweepers_at_once_wake_each_idle_run_once(launch, woken) -> None:
    runs = [launch([final()]) for _ in range(20)]
    for run in runs:
        make_idle(run)
    woken.clear()
    at_once(lambda _: tasks.sweep(), range(2))
    assert sorted(woken) == sorted(r.pk for r in runs)


@requires_postgres()
def test_two_sweepers_fail_a_late_waiting_run_once_and_expire_its_approval(launch, drive, woken) -> None:
    script = [call("fetch_fixture", text="x"), call("ledger_write", entry=1), final()]
    run = drive(launch(script, limits={"deadline_seconds": 1}))
    assert run.state == "awaiting_approval"
    wait_for(lambda: Run.objects.get(pk=run.pk).deadline < timezone.now(), what="the deadline")
    wait_for(lambda: timezone.now().timestamp() > run.engine["deadline"], what="the engine deadline")
    results = at_once(lambda _: tasks.sweep(), range(2))
    assert sorted(r["failed"] for r in results) == [0, 1]
    run.refresh_from_db()
    assert run.state == "failed" and run.error.startswith("deadline passed")
    assert run.transitions.filter(to_state="failed").count() == 1
    assert Approval.objects.get(run=run).status == "expired"
    assert run.lease_owner is None


def test_claims_that_die_are_counted_and_a_fourth_claim_fails_the_run(launch, settings) -> None:
    settings.AIRLOCK_MAX_DEAD_CLAIMS = 3
    run = launch([call("echo", text="hi"), final()])
    past = timezone.now() - dt.timedelta(seconds=1)
    for n in range(3):
        assert driver.take_lease(run.pk, f"worker:dead:{n}")
        Run.objects.filter(pk=run.pk).update(lease_expires=past)  # the worker died: no release
    assert Run.objects.get(pk=run.pk).claims_without_progress == 3
    run = driver.drive(run.pk)
    assert run.state == "failed"
    assert run.error == (
        "poison run: 3 worker leases in a row ended without progress "
        "(the worker died or the step crashed each time; AIRLOCK_MAX_DEAD_CLAIMS 3)"
    )
    assert run.claims_without_progress == 0 and run.lease_owner is None


def test_clean_claims_without_progress_do_not_count(launch, drive) -> None:
    run = drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry=1), final()]))
    assert run.state == "awaiting_approval"
    for _ in range(6):
        run = drive(run)  # a waiting run: claimed, nothing to do, released cleanly
    assert run.state == "awaiting_approval" and run.claims_without_progress == 0


def test_progress_clears_the_count(launch) -> None:
    run = launch([call("echo", text="hi"), final()])
    Run.objects.filter(pk=run.pk).update(claims_without_progress=2)
    run = driver.drive(run.pk)
    assert run.state == "done" and run.claims_without_progress == 0


def test_wake_logs_and_returns_when_the_broker_refuses(monkeypatch, caplog) -> None:
    from kombu.exceptions import OperationalError

    def refuse(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(broker, "send", refuse)
    broker.wake_run(12345)
    assert "wake-up for run=12345 not sent (OperationalError" in caplog.text
