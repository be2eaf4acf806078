"""A worker's database connections follow its database work, not its threads: they
come from a bounded pool and go back to it whenever a run waits; a
connection the server dropped is replaced at the next use."""

from __future__ import annotations

from django.db import connection

from agents.models import Run
from bench.waiting import Sampler
from tests.helpers import call, final, wait_for
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS
APP = "airlock-test-worker"


def worker_backends() -> list[int]:
    with connection.cursor() as cur:
        cur.execute(
            "select pid from pg_stat_activity where datname = current_database() and application_name = %s", [APP]
        )
        return sorted(row[0] for row in cur.fetchall())


def finish(launch, text: str) -> None:
    run = launch([call("echo", text=text), final(text)])
    wait_for(lambda: Run.objects.filter(pk=run.pk, state="done").exists(), timeout=60, what=f"run {text} done")


def test_twenty_waiting_runs_share_a_pool_of_three_connections(cluster: Cluster, launch) -> None:
    # 32 threads, 3 connections: were a connection held across a tool's wait, at most
    # three runs could be waiting at once and the rest would queue for the pool.
    cluster.start_worker("w1", AIRLOCK_DB_POOL_MAX="3", PGAPPNAME=APP)
    runs = [
        launch([call("sleep", seconds=2), call("ledger_write", entry=f"r{i}"), call("sleep", seconds=1.5), final()])
        for i in range(20)
    ]
    ids = [r.pk for r in runs]
    with Sampler(ids, application_name=APP) as sampler:
        wait_for(lambda: Run.objects.filter(pk__in=ids, state="done").count() == 20, timeout=120, what="20 runs done")
    assert sampler.most_in_flight >= 10, f"only {sampler.most_in_flight} runs in flight at once"
    assert 1 <= sampler.most_connections <= 3, f"{sampler.most_connections} sessions for a pool of 3"


def test_a_dropped_connection_is_replaced_at_the_next_use(cluster: Cluster, launch) -> None:
    cluster.start_worker("w1", PGAPPNAME=APP)
    finish(launch, "before")
    with connection.cursor() as cur:
        for pid in worker_backends():
            cur.execute("select pg_terminate_backend(%s)", [pid])
    # The pool checks a connection before handing it out, finds it dead and opens a
    # new one, so the run still finishes.
    finish(launch, "after")


def test_a_solo_worker_keeps_its_connection_usable_from_task_to_task(cluster: Cluster, launch) -> None:
    # Celery's solo pool sends worker_process_init in the worker's own process, and
    # Celery's Django fixup answers that signal as if it were a forked child: it closes
    # each open connection's socket under psycopg's feet. The next task then waited
    # forever on a file descriptor that Redis had been given meanwhile.
    cluster.start_worker("w1", pool="solo", PGAPPNAME=APP)
    for text in ("first", "second", "third"):
        finish(launch, text)
