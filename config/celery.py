"""The Celery app: tasks are wake-ups for the driver; settings come from Django's
(namespace CELERY_)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_process_init

from .fsbroker import register as register_fsbroker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

register_fsbroker()  # the embedded default's broker, airlockfs:// (before any connection)
app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def worker_argv(
    *,
    hostname: str,
    pool: str | None = None,
    concurrency: int | None = None,
    queues: str | None = None,
    heartbeat: bool = True,
) -> list[str]:
    """The command line of a worker on this app, for every launcher that starts one
    (`make run`, the test cluster, `make chaos`, `make bench`). Without `pool` and
    `concurrency` they come from settings (AIRLOCK_WORKER_POOL, _CONCURRENCY); note
    that Celery replaces `--pool prefork` with the configured pool. `heartbeat=False`
    turns off Celery's worker heartbeat events, not the lease heartbeat."""
    return [
        sys.executable, "-m", "celery", "-A", "config", "worker",
        *(["--pool", pool] if pool is not None else []),
        *(["--queues", queues] if queues is not None else []),
        "--loglevel", "INFO",
        *(["--concurrency", str(concurrency)] if concurrency is not None else []),
        "--without-gossip", "--without-mingle",
        *([] if heartbeat else ["--without-heartbeat"]),
        "--hostname", hostname,
    ]  # fmt: skip


def beat_argv(*, schedule: Path) -> list[str]:
    """The command line of the beat scheduler on this app, keeping its state in `schedule`."""
    return [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO", "--schedule", str(schedule)]


# -- database connections (measured by `make bench`) -----------------------------------
# Celery's Django fixup closes every connection before and after each task unless
# CELERY_DB_REUSE_MAX is set, so each wake-up paid for a new PostgreSQL connection: a
# fifth of a busy worker's time. Django's own rule applies instead, as between two HTTP
# requests: a connection lives CONN_MAX_AGE (DB_CONN_MAX_AGE; 0 closes it after every
# task), and one that errored or fails its health check is replaced. (Settings set
# CELERY_DB_REUSE_MAX so the fixup's own closing never happens.)
# With the connection pool (PostgreSQL's default) CONN_MAX_AGE is 0, so
# every task hands its thread's connection back to the pool when it ends: a threaded
# worker holds connections for the database work in flight, not for its threads.


@task_prerun.connect
@task_postrun.connect
def _django_connection_rules(task: Any = None, **kwargs: Any) -> None:
    if task is not None and getattr(task.request, "is_eager", False):
        return  # an eager task runs inside the caller's transaction: leave it alone
    # Late: config/__init__ loads this module before Django's settings are set up.
    from django.db import close_old_connections

    close_old_connections()


# -- the solo pool and Celery's Django fixup ---------------------------------------------
# Celery 5.7's solo pool sends worker_process_init in the worker's own process, and the
# Django fixup answers it as it would in a forked child: it closes each open
# connection's socket with os.close, under psycopg's feet. The pooled connection then
# looked alive, its file descriptor went to a Redis socket, and the worker's next task
# waited forever on it (tests/workers/test_connections.py). Closing the connections the
# proper way first leaves the fixup nothing to close. A forked child (prefork) is left
# to the fixup: there the sockets are the parent's and must not be talked to.
_MAIN_PID = os.getpid()


@worker_process_init.connect
def _close_connections_before_the_fixup(**kwargs: Any) -> None:
    if os.getpid() != _MAIN_PID:
        return
    # Late: config/__init__ loads this module before Django's settings are set up.
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.close()
