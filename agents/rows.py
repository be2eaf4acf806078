"""Read-only rows for the pages polled every second, without a queryset per request.

A queryset is built, compiled to SQL and its rows converted on every request: for the
timeline's small reads that was 0.4-0.6 ms each, two to three times the query itself
(a 1,000-step timeline spent more time in the ORM than in PostgreSQL). A `Rows` names a
model's columns once and runs plain SQL; each value still goes through the converters
the ORM would apply (a JSONField's decoding, SQLite's datetimes), so a row holds what
`values_list(..., named=True)` would have given. Writes never come through here.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from typing import Any

from django.db import connection, models


class Rows:
    """`fields` of `model`'s table as named tuples, filtered by a WHERE clause in SQL."""

    def __init__(self, model: type[models.Model], fields: Sequence[str]) -> None:
        self.model = model
        self.fields = [model._meta.get_field(name) for name in fields]
        self.row = namedtuple(f"{model.__name__}Row", fields)  # type: ignore[misc]

    def fetch(self, where: str, params: Sequence[Any], *, order_by: str, limit: int | None = None) -> list[Any]:
        """Rows matching `where` (SQL on the table's own columns, `%s` for each of `params`)."""
        qn = connection.ops.quote_name
        columns = ", ".join(qn(f.column) for f in self.fields)
        sql = f"SELECT {columns} FROM {qn(self.model._meta.db_table)} WHERE {where} ORDER BY {order_by}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            raw = cursor.fetchall()
        # The same converters, in the same order, as the ORM's compiler applies.
        converters = [
            (i, [*connection.ops.get_db_converters(f.cached_col), *f.get_db_converters(connection)], f.cached_col)
            for i, f in enumerate(self.fields)
        ]
        converters = [(i, funcs, col) for i, funcs, col in converters if funcs]
        if not converters:
            return [self.row._make(r) for r in raw]
        out = []
        for r in raw:
            values = list(r)
            for i, funcs, col in converters:
                for convert in funcs:
                    values[i] = convert(values[i], col, connection)
            out.append(self.row._make(values))
        return out


def placeholders(values: Sequence[Any]) -> str:
    """`%s, %s, ...` for an IN list of `values` (never empty: the caller checks)."""
    return ", ".join(["%s"] * len(values))
