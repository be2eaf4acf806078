"""Model instances from hand-written SELECTs, for the reads every drive makes.

Django builds a queryset's SQL afresh on every call. A worker reads a run with its
profile, the run's transcript and the MCP tools on offer for each run it drives: as
querysets that was about 1.3 ms of Python for 0.3 ms in the database, a tenth of a
10-call run (docs/performance.md). These reads keep their SQL in module constants
and convert each column as the ORM would (its converters, then `Model.from_db`), so
the instances are the ones a queryset returns, on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import connection, models

M = TypeVar("M", bound=models.Model)


class Columns:
    """Some (by default all) concrete columns of `model`, read under table alias
    `alias`: `sql` lists them for a SELECT, `instance()` turns them back into a model."""

    def __init__(self, model: type[models.Model], alias: str, names: Sequence[str] = ()) -> None:
        self.model = model
        self.fields = [model._meta.get_field(n) for n in names] if names else list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.sql = ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in self.fields)
        self.width = len(self.fields)

    @functools.cached_property
    def _converters(self) -> list[tuple[int, Any, list[Any]]]:
        # What SQLCompiler.get_converters finds for these columns: the backend's (SQLite
        # parses datetimes) and the field's own (JSONField decodes its text).
        found = []
        for i, field in enumerate(self.fields):
            col = field.get_col(self.model._meta.db_table)
            converters = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
            if converters:
                found.append((i, col, converters))
        return found

    def values(self, row: Sequence[Any]) -> list[Any]:
        """The Python values of these columns in `row` (the first `width` items)."""
        values = list(row[: self.width])
        for i, col, converters in self._converters:
            for convert in converters:
                values[i] = convert(values[i], col, connection)
        return values

    def instance(self, row: Sequence[Any]) -> Any:
        """A saved model instance from the first `width` items of `row`."""
        return self.model.from_db(connection.alias, self.attnames, self.values(row))


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
