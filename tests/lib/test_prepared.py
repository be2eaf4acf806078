"""agents.lib.prepared: a prepared statement and the statements around it in one round
trip, each with its own effects in order; independent reads sent together; long fixed
texts parsed once."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from agents.lib import prepared
from tests.helpers import requires_postgres

pytestmark = [pytest.mark.django_db, requires_postgres()]


def test_the_statements_before_and_after_take_effect_around_the_prepared_one() -> None:
    with transaction.atomic():
        _before, [row], _after = prepared.pipelined([
            ("SELECT set_config('airlock.test', %s, true)", ["before"], False),
            ("SELECT current_setting('airlock.test'), %s::int + 1", [41], True),
            ("SELECT set_config('airlock.test', 'after', true)", None, False),
        ])
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('airlock.test')")
            now = cursor.fetchone()
    assert row == ("before", 42) and now == ("after",)


def test_a_failing_statement_is_djangos_error_and_the_transaction_rolls_back() -> None:
    with pytest.raises(DatabaseError), transaction.atomic():
        prepared.pipelined([("SELECT 1 / %s", [0], False), ("SELECT %s::int", [1], True)])
    with transaction.atomic():
        assert prepared.pipelined([("SELECT %s::int", [7], True)]) == [[(7,)]]


def test_a_long_text_is_parsed_once_per_connection_and_bound_afresh_each_time() -> None:
    """psycopg remembers a text's conversion only up to 4 kB and 50 values; the
    prepared cursor keeps longer fixed texts' (a history rule set's figures). The
    override hooks psycopg's `_convert_query`: it must still be psycopg's name."""
    from psycopg._cursor_base import BaseCursor

    assert "_convert_query" in vars(BaseCursor)
    values = 60
    sql = "SELECT " + ", ".join(["%s::int"] * values) + " -- " + "x" * 4096
    first = prepared.fetchone(sql, list(range(values)))
    second = prepared.fetchone(sql, list(range(100, 100 + values)))
    assert first == tuple(range(values)) and second == tuple(range(100, 100 + values))
    assert sql in prepared._cursor().cursor._converted


def test_reads_sent_together_each_answer_prepared_in_one_round_trip() -> None:
    from tests.helpers import round_trips

    first, second = "SELECT %s::int * 2 -- fetch_together 1", "SELECT g FROM generate_series(1, %s) g -- fetch_together 2"
    with connection.cursor() as cursor:  # the test's transaction begins (its BEGIN is a round trip of its own)
        cursor.execute("SELECT 1")
    with round_trips() as trips:
        found = prepared.fetch_together([(first, [21]), (second, [3])])
    assert found == [[(42,)], [(1,), (2,), (3,)]]
    assert trips.count == 1, trips.messages
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        kept = {row[0] for row in cursor.fetchall()}
    assert any("fetch_together 1" in s for s in kept) and any("fetch_together 2" in s for s in kept)
    # Sent one by one, the same two reads are two round trips.
    with round_trips() as trips:
        prepared.fetchall(first, [1])
        prepared.fetchall(second, [1])
    assert trips.count == 2, trips.messages


def test_a_failing_read_sent_together_is_djangos_error() -> None:
    with pytest.raises(DatabaseError), transaction.atomic():
        prepared.fetch_together([("SELECT %s::int", [1]), ("SELECT 1 / %s", [0])])
    assert prepared.fetch_together([("SELECT %s::int", [5])]) == [[(5,)]]


def test_two_one_row_reads_beside_each_other_keep_their_own_values() -> None:
    """`beside` makes one statement of two: the first's columns, then the second's,
    each read with its own values, `%s` or `%(name)s` (a name used twice, a literal %)."""
    first = ("SELECT %s::int AS a, '100%%' AS b, %s::text AS c", [1, "one"], True)
    second = ("WITH w AS (SELECT %(x)s::int AS x) SELECT x, x + %(x)s::int, %(y)s::text FROM w", {"x": 2, "y": "two"}, True)
    sql, values, kept = prepared.beside(first, second)
    assert kept and prepared.fetchall(sql, values) == [(1, "100%", "one", 2, 4, "two")]


def test_a_timestamptz_reads_as_the_orm_reads_it_through_psycopgs_own_loader() -> None:
    """Django loads timestamptz through a Python subclass of psycopg's loader; a
    prepared cursor on a UTC session takes psycopg's own (C) one, which gives the same
    value, in the same zone object."""
    import datetime as dt

    from django.contrib.auth.models import User
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader
    from psycopg.postgres import types
    from psycopg.pq import Format

    user = User.objects.create(username="stamped")
    orm = User.objects.values_list("date_joined", flat=True).get(pk=user.pk)
    [(read,)] = prepared.fetchall("SELECT date_joined FROM auth_user WHERE id = %s", [user.pk])
    assert read == orm and read.tzinfo is orm.tzinfo is dt.UTC
    loader = prepared._cursor().cursor.adapters.get_loader(types["timestamptz"].oid, Format.TEXT)
    assert not issubclass(loader, BaseTzLoader)
