"""Many runs in one process, in process: a lease belongs to a thread, and
one heartbeat renews every lease the process holds."""

from __future__ import annotations

import datetime as dt
import logging
import threading

import pytest
from django.utils import timezone

from agents import broker, tasks
from agents.models import LedgerEntry, Run, ToolCall
from agents.runs import driver, worker
from tests.helpers import at_once, call, final, requires_postgres

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_thread_is_its_own_lease_owner() -> None:
    names = at_once(lambda _: driver.worker_name(), range(2))
    assert names[0] != names[1]
    assert names[0].rsplit(":", 1)[0] == names[1].rsplit(":", 1)[0]  # same host and process


@requires_postgres()
def test_two_threads_of_one_process_given_the_same_run_drive_it_once(launch, monkeypatch, caplog) -> None:
    monkeypatch.setattr(broker, "wake_run", lambda run_id: None)
    run = launch([call("sleep", seconds=0.5), call("ledger_write_unsafe", entry="once"), final("done")])
    with caplog.at_level(logging.INFO, logger="airlock.tasks"):
        at_once(lambda _: tasks.advance_run(run.pk), range(2))
    run.refresh_from_db()
    assert run.state == "done"
    # The thread that lost the claim wrote nothing and said who holds the run; with one
    # owner name per process it used to pass claim() and step the run beside the winner.
    refused = [r.getMessage() for r in caplog.records if f"advance_run run={run.pk} no-op: leased by" in r.getMessage()]
    actors = set(run.transitions.filter(seq__gt=1).values_list("actor", flat=True))
    assert len(refused) == 1 and len(actors) == 1 and refused[0].endswith(f"{actors.pop()} redelivered=False")
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert list(ToolCall.objects.filter(run=run, tool="ledger_write_unsafe").values_list("attempts", flat=True)) == [1]


def test_one_heartbeat_renews_every_lease_the_process_still_holds(launch) -> None:
    runs = [launch([final()]) for _ in range(3)]
    owners = [f"worker:test:1:{i}" for i in range(3)]
    for run, owner in zip(runs, owners, strict=True):
        assert driver.take_lease(run.pk, owner, seconds=1)
    driver.release(runs[2].pk, owners[2])  # finished before the beat: not renewed
    assert worker.LeaseHeartbeat.renew({(r.pk, o) for r, o in zip(runs, owners, strict=True)}) == 2
    soon = timezone.now() + dt.timedelta(seconds=30)
    leases = dict(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", "lease_expires"))
    assert leases[runs[0].pk] > soon and leases[runs[1].pk] > soon and leases[runs[2].pk] is None


def test_the_heartbeat_tracks_each_thread_holding_a_run_apart() -> None:
    beat = worker.LeaseHeartbeat()
    with beat.holding(7, "worker:h:1:1"):
        with beat.holding(7, "worker:h:1:2"):  # a duplicate wake-up on a second thread
            assert beat.held() == {(7, "worker:h:1:1"), (7, "worker:h:1:2")}
        assert beat.held() == {(7, "worker:h:1:1")}  # the winner's lease is still renewed
    assert beat.held() == set()
    assert any(t.name == "lease-heartbeat" for t in threading.enumerate())
