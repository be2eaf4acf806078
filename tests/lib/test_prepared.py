"""agents.lib.prepared.together: a prepared statement and the statements around it in
one round trip, each with its own effects in order."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from agents.lib import prepared
from tests.helpers import requires_postgres

pytestmark = [pytest.mark.django_db, requires_postgres()]


def test_the_statements_before_and_after_take_effect_around_the_prepared_one() -> None:
    with transaction.atomic():
        row = prepared.together(
            [("SELECT set_config('airlock.test', %s, true)", ["before"])],
            "SELECT current_setting('airlock.test'), %s::int + 1",
            [41],
            ["SELECT set_config('airlock.test', 'after', true)"],
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('airlock.test')")
            now = cursor.fetchone()
    assert row == ("before", 42) and now == ("after",)


def test_a_failing_statement_is_djangos_error_and_the_transaction_rolls_back() -> None:
    with pytest.raises(DatabaseError), transaction.atomic():
        prepared.together([("SELECT 1 / %s", [0])], "SELECT %s::int", [1])
    with transaction.atomic():
        assert prepared.together([], "SELECT %s::int", [7]) == (7,)


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
