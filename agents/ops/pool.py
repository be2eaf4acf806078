"""The database pool's check of a connection it hands out, without a round trip.

With CONN_HEALTH_CHECKS on (config/settings.py), Django's pool (psycopg_pool) sends each
connection an empty query before handing it out: a round trip on every request's
checkout, and on each of a gateway call's trips to the database threads (which give
their connection back between trips), about a third of `GET /api/runs/<id>`'s three.
Here a connection gets that query only when it shows a sign that the server let it go:
closed or broken as psycopg saw it, or its socket readable while it sat idle in the
pool. A server that ends a connection (a restart, `pg_terminate_backend`, an idle
timeout) sends its error and closes the socket, which makes it readable; an idle
connection the server keeps has nothing to read. Such a connection is checked as
before, and the pool replaces it if the check fails, so a request right after a
database restart still gets a live connection.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.signals import connection_created


def check(conn: Any) -> None:
    """psycopg_pool's `check`: raise for a connection the pool must not hand out."""
    # Late: psycopg, which a SQLite deployment may lack (only a PostgreSQL pool calls this).
    from psycopg import OperationalError
    from psycopg_pool import ConnectionPool

    if conn.closed or conn.broken:
        raise OperationalError("the connection was closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)  # the server wrote or hung up: ask it


def _installed(sender: Any, connection: Any, **kwargs: Any) -> None:
    # Django builds the pool with psycopg_pool's own check (an empty query each time)
    # and offers no setting for another: it is put in place at the pool's first
    # connection, before any is handed out again.
    if connection.vendor != "postgresql" or not connection.settings_dict["CONN_HEALTH_CHECKS"]:
        return
    pool = getattr(connection, "pool", None)
    if pool is not None and getattr(pool, "_check", None) not in (None, check):
        pool._check = check  # noqa: SLF001 - psycopg_pool takes `check` only at construction


def install() -> None:
    connection_created.connect(_installed, dispatch_uid="airlock.pool_check")
