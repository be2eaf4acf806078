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


def test_a_connection_the_server_ended_is_never_handed_out(asked: list[int]) -> None:
    import psycopg

    backend_pid()
    connection.close()  # back to the pool, idle with the rest
    with psycopg.connect(_dsn(), autocommit=True) as other:
        # Every connection of the pool (all of this database's but this one) ended by
        # the server, as a restart ends them; each call waits until its backend is gone.
        dead = [pid for (pid,) in other.execute(
            "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"
        ).fetchall()]
        assert dead
        for pid in dead:
            other.execute("select pg_terminate_backend(%s, 5000)", [pid])
    live = backend_pid()  # the check saw the hang-up, asked, and the pool replaced it
    assert live not in dead
    assert set(asked) <= set(dead) and asked  # only a connection that showed a sign was asked
    with connection.cursor() as cur:
        cur.execute("select 1")
        assert cur.fetchone()[0] == 1


def _dsn() -> str:
    kwargs = connection.pool.kwargs
    return " ".join(f"{k}={v}" for k, v in kwargs.items() if k in ("host", "port", "user", "password", "dbname") and v)
