"""A worker keeps its database connection between tasks (Django's CONN_MAX_AGE, not
Celery's close-around-every-task) and replaces one the server dropped."""

from __future__ import annotations

from django.db import connection

from agents.models import Run
from tests.helpers import call, final, wait_for
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS


def worker_backends() -> list[int]:
    """Server pids of the other sessions on the test database: the worker's."""
    with connection.cursor() as cur:
        cur.execute("select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()")
        return sorted(row[0] for row in cur.fetchall())


def single(backends: list[int]) -> list[int] | None:
    return backends if len(backends) == 1 else None


def finish(launch, text: str) -> None:
    run = launch([call("echo", text=text), final(text)])
    wait_for(lambda: Run.objects.filter(pk=run.pk, state="done").exists(), timeout=60, what=f"run {text} done")


def test_a_worker_reuses_its_connection_across_tasks(cluster: Cluster, launch) -> None:
    cluster.start_worker("w1", DB_CONN_MAX_AGE="600")
    finish(launch, "first")
    # One session once the task is over (a lease heartbeat's own closes with the task).
    first = wait_for(lambda: single(worker_backends()), timeout=10, what="one session")
    for i in range(3):
        finish(launch, f"again {i}")
    # Celery's fixup used to close the connection around every task: a new pid each time.
    wait_for(lambda: worker_backends() == first, timeout=10, what="the same session after three tasks")


def test_a_dropped_connection_is_replaced_at_the_next_task(cluster: Cluster, launch) -> None:
    cluster.start_worker("w1", DB_CONN_MAX_AGE="600")
    finish(launch, "before")
    with connection.cursor() as cur:
        for pid in worker_backends():
            cur.execute("select pg_terminate_backend(%s)", [pid])
    # The health check at the next task's first query finds the connection dead and
    # opens a new one, so the run still finishes.
    finish(launch, "after")
