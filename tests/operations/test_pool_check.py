"""The pool hands out a connection without a round trip unless the server let it go
(agents/ops/pool.py): a connection the server ended while it sat idle is still never
handed out, so a request after a database restart gets a live one."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from agents.ops import pool
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


def backend_pid() -> int:
    with connection.cursor() as cur:
        cur.execute("select pg_backend_pid()")
        return int(cur.fetchone()[0])


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The empty queries psycopg_pool's own check sends (each a round trip), counted."""
    from psycopg_pool import ConnectionPool

    sent: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: Any) -> None:
        sent.append(conn.info.backend_pid)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return sent


def test_the_pool_checks_with_ours(settings: Any) -> None:
    backend_pid()
    assert connection.settings_dict["OPTIONS"].get("pool")
    assert connection.pool._check is pool.check  # a psycopg_pool that renamed it fails here


def test_an_idle_live_connection_is_handed_out_without_a_round_trip(asked: list[int]) -> None:
    seen = set()
    for _ in range(12):  # round the pool's connections more than once
        seen.add(backend_pid())
        connection.close()  # back to the pool
    assert asked == []
    assert len(seen) < 12  # connections were reused, not opened anew


def test_a_connection_the_server_ended_fails_the_check_and_only_it_is_asked(asked: list[int]) -> None:
    import psycopg

    with psycopg.connect(_dsn(), autocommit=True) as pooled, psycopg.connect(_dsn(), autocommit=True) as other:
        pid = pooled.info.backend_pid
        pool.check(pooled)  # live and idle: handed out, nothing asked
        assert asked == []
        # Ended by the server, as a restart ends it; the call waits until the backend is gone.
        assert other.execute("select pg_terminate_backend(%s, 5000)", [pid]).fetchone()[0]
        with pytest.raises(psycopg.OperationalError):
            pool.check(pooled)  # the socket said so: asked, and the pool replaces it
        assert asked == [pid]


def test_the_pool_replaces_a_connection_the_server_ended(asked: list[int]) -> None:
    """End to end through Django's pool: the connection a request is handed next was
    ended by the server while idle; the request still gets a live one."""
    import psycopg

    dead = backend_pid()
    connection.close()  # back to the pool, idle
    # Every other idle connection of the pool is taken out for the moment, so the one
    # just returned is the one the next request gets.
    held = []
    while (spare := connection.pool.getconn()).info.backend_pid != dead:
        held.append(spare)
    connection.pool.putconn(spare)
    try:
        with psycopg.connect(_dsn(), autocommit=True) as other:
            assert other.execute("select pg_terminate_backend(%s, 5000)", [dead]).fetchone()[0]
        live = backend_pid()
        assert live != dead and dead in asked
    finally:
        connection.close()
        for conn in held:
            connection.pool.putconn(conn)


def _dsn() -> str:
    kwargs = connection.pool.kwargs
    return " ".join(f"{k}={v}" for k, v in kwargs.items() if k in ("host", "port", "user", "password", "dbname") and v)
