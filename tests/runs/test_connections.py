"""How the driver uses its database connection on PostgreSQL: the transition statement
is prepared on the server once per shape and reused, and the connection goes back to
the pool only when a tool makes the driver wait."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.helpers import call, final, requires_postgres

pytestmark = [pytest.mark.django_db(transaction=True), requires_postgres()]


def forget_prepared() -> None:
    """Start from a connection with nothing prepared (psycopg forgets its list too)."""
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")


def prepared_transitions() -> list[str]:
    """The transition statements prepared on this thread's connection."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE 'WITH r AS (UPDATE agents_run %%'")
        return [row[0] for row in cur.fetchall()]


def pool_checkouts() -> int:
    return int(connection.pool.get_stats()["requests_num"])


def test_the_transition_statement_is_prepared_once_per_shape(settings, launch, drive) -> None:
    # Django turns psycopg's preparing off; a regression here silently re-plans every
    # transition (planning cost 4x the statement's execution).
    assert settings.AIRLOCK_PREPARED_STATEMENTS
    forget_prepared()
    # The echo tool answers at once, so the drive keeps this connection throughout.
    script = [call("echo", text="a"), call("echo", text="b"), final()]
    assert drive(launch(script)).state == "done"
    shapes = prepared_transitions()
    # pickup; a call with its intent; a result; the answer that ends the run
    assert 3 <= len(shapes) == len(set(shapes)) <= 5, shapes
    assert drive(launch(script)).state == "done"
    assert sorted(prepared_transitions()) == sorted(shapes)  # reused, none added


def test_the_statement_is_not_prepared_when_turned_off(settings, launch, drive) -> None:
    settings.AIRLOCK_PREPARED_STATEMENTS = False
    forget_prepared()
    assert drive(launch([call("echo", text="a"), final()])).state == "done"
    assert prepared_transitions() == []


def test_a_quick_tool_keeps_the_connection_a_slow_one_gives_it_back(launch, drive) -> None:
    assert connection.pool is not None
    connection.ensure_connection()
    before = pool_checkouts()
    assert drive(launch([call("echo", text="a"), call("echo", text="b"), call("echo", text="c"), final()])).state == "done"
    quick = pool_checkouts() - before
    before = pool_checkouts()
    slow = [call("sleep", seconds=s) for s in (0.05, 0.06, 0.07)] + [final()]
    assert drive(launch(slow)).state == "done"
    # Each of the three waits gave the connection back and took one again afterwards.
    assert quick <= 1 and pool_checkouts() - before >= 3, (quick, pool_checkouts() - before)
