"""Rows and model instances from written-out SQL, for the reads made most often.

Django builds a queryset's SQL afresh on every call. A worker reads a run with its
profile, the run's transcript and the MCP tools on offer for each run it drives, and
a timeline polled every second reads its chart, transitions, messages and journal: as
querysets each read cost two to four times its time in the database (reading a run
with its profile 0.55 ms for 0.1 ms of SQL; docs/performance.md). Here the SQL is
written once, and each value goes through the converters the ORM applies (a
JSONField's decoding, SQLite's datetimes), so a row or an instance holds what a
queryset would have given, on PostgreSQL and SQLite alike. Writes never come through
here. A read made on most API requests, whose text is fixed, is also prepared on the
server (`prepared=True`, agents/lib/prepared.py), so PostgreSQL plans it once per
connection instead of on every request.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Sequence
from typing import Any, cast

from django.db import connection, models
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from agents.lib import prepared as server


class Columns:
    """Some (by default all) concrete columns of `model`, read under table alias
    `alias`: `sql` lists them for a SELECT, `values()` converts them as the ORM does,
    `instance()` makes them a model instance."""

    def __init__(self, model: type[models.Model], alias: str, names: Sequence[str] = ()) -> None:
        self.model = model
        self.fields = [model._meta.get_field(n) for n in names] if names else list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.sql = ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in self.fields)
        self.width = len(self.fields)

    @functools.cached_property
    def _converters(self) -> list[tuple[int, Any, list[Any]]]:
        # What the ORM's compiler finds for these columns, in its order: the backend's
        # (SQLite parses datetimes), then the field's own (JSONField decodes its text).
        found = []
        for i, field in enumerate(self.fields):
            col = field.cached_col
            converters = [*connection.ops.get_db_converters(col), *field.get_db_converters(connection)]
            if converters:
                found.append((i, col, converters))
        return found

    @functools.cached_property
    def _plain(self) -> bool:
        # Neither making nor loading an instance is the model's own.
        return self.model.__init__ is models.Model.__init__ and (
            self.model.from_db.__func__ is models.Model.from_db.__func__
        )

    def values(self, row: Sequence[Any]) -> list[Any]:
        """The Python values of these columns, the first `width` items of `row`."""
        values = list(row[: self.width])
        for i, col, converters in self._converters:
            for convert in converters:
                values[i] = convert(values[i], col, connection)
        return values

    def instance(self, row: Sequence[Any]) -> Any:
        """A saved model instance from the first `width` items of `row`: what
        `from_db` makes, built without `Model.__init__`'s walk over every field (a
        third of making a run with its profile and launcher) when no `pre_init` or
        `post_init` receiver is listening for the model, which that walk would call."""
        model = self.model
        if not self._plain or pre_init.has_listeners(model) or post_init.has_listeners(model):
            return model.from_db(connection.alias, self.attnames, self.values(row))
        made: Any = object.__new__(model)
        # An attname is never a data descriptor on a fresh instance (a foreign key's
        # `_id` descriptor only clears a cached related object), so `__dict__` is what
        # `__init__`'s setattr would fill; a column left out (deferred) stays absent.
        made.__dict__.update(zip(self.attnames, self.values(row), strict=True))
        made._state = state = ModelState()
        state.adding, state.db = False, connection.alias
        return made


def fetch(sql: str, params: Sequence[Any], *, prepared: bool = False) -> list[tuple[Any, ...]]:
    """The rows of `sql`; with `prepared`, a statement of fixed text, prepared on the
    server (agents/lib/prepared.py)."""
    if prepared:
        return server.fetchall(sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


class Joined:
    """Instances of `model` with the rows its foreign keys `related` point to attached
    (what `select_related(*related)` gives; a null key attaches None), for the rows
    matching `where`: SQL on the alias `a` for the model's table and `b0`, `b1`... for
    the related ones, which may end in ORDER BY. Fields named in `defer` are left
    unread, as `defer()` leaves them. `prepared`: see `fetch`. `beside`: (attribute,
    model, ON clause) for a row of another table read in the same statement (aliases
    `c0`, `c1`...; LEFT JOIN, its `%s` before the WHERE clause's), set on each instance
    under that attribute, None when no row matched (what a Prefetch's `to_attr` does).
    `annotate`: (attribute, SQL expression on those aliases) read in the same statement
    and set on each instance (what `annotate()` gives)."""

    def __init__(
        self, model: type[models.Model], related: Sequence[str], where: str, *, defer: Sequence[str] = (),
        prepared: bool = False, beside: Sequence[tuple[str, type[models.Model], str]] = (),
        annotate: Sequence[tuple[str, str]] = (),
    ) -> None:
        # One name may come bare: a str is a sequence too, and would be read letter by letter.
        names = (related,) if isinstance(related, str) else tuple(related)
        self.model, self.related, self.where, self.defer = model, names, where, set(defer)
        self.prepared, self.beside, self.annotate = prepared, tuple(beside), tuple(annotate)

    @functools.cached_property
    def _parts(self) -> tuple[str, Columns, list[tuple[Any, Columns]]]:
        # Built on first use: the app registry is complete by then.
        qn = connection.ops.quote_name
        names = [f.name for f in self.model._meta.concrete_fields if f.name not in self.defer]
        own = Columns(self.model, "a", names)
        joins, select, joined = [], [own.sql], []
        for i, name in enumerate(self.related):
            field = self.model._meta.get_field(name)
            other = Columns(field.related_model, f"b{i}")
            kind = "LEFT JOIN" if field.null else "JOIN"
            joins.append(
                f" {kind} {qn(field.related_model._meta.db_table)} b{i}"
                f" ON b{i}.{qn(field.target_field.column)} = a.{qn(field.column)}"
            )
            select.append(other.sql)
            joined.append((field, other))
        for i, (attribute, model, on) in enumerate(self.beside):
            other = Columns(model, f"c{i}")
            joins.append(f" LEFT JOIN {qn(model._meta.db_table)} c{i} ON {on}")
            select.append(other.sql)
            joined.append((attribute, other))
        select += [expression for _attribute, expression in self.annotate]
        sql = f"SELECT {', '.join(select)} FROM {qn(self.model._meta.db_table)} a{''.join(joins)} WHERE {self.where}"
        return sql, own, joined

    @property
    def sql(self) -> str:
        return self._parts[0]

    def fetch(self, params: Sequence[Any]) -> list[Any]:
        return self.instances(fetch(self.sql, params, prepared=self.prepared))

    def instances(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """The instances of rows this statement (`sql`) read, as `fetch` makes them."""
        _sql, own, joined = self._parts
        found = []
        for row in rows:
            instance = own.instance(row)
            at = own.width
            for field, other in joined:
                part = row[at : at + other.width]
                if isinstance(field, str):  # a row beside: its primary key (first) is NULL when none matched
                    setattr(instance, field, None if part[0] is None else other.instance(part))
                else:
                    # A null foreign key (LEFT JOIN): no related row, as select_related gives.
                    field.set_cached_value(
                        instance, None if getattr(instance, field.attname) is None else other.instance(part)
                    )
                at += other.width
            for (attribute, _expression), value in zip(self.annotate, row[at:], strict=True):
                setattr(instance, attribute, value)
            found.append(instance)
        return found


class Rows:
    """`fields` of `model`'s table as named tuples, filtered by a WHERE clause in SQL:
    what `values_list(*fields, named=True)` gives."""

    def __init__(self, model: type[models.Model], fields: Sequence[str]) -> None:
        self.table = connection.ops.quote_name(model._meta.db_table)
        self.columns = Columns(model, self.table, fields)
        self.row = namedtuple(f"{model.__name__}Row", fields)  # type: ignore[misc]

    def fetch(self, where: str, params: Sequence[Any], *, order_by: str, limit: int | None = None) -> list[Any]:
        """Rows matching `where` (SQL on the table's own columns, `%s` for each of `params`)."""
        sql = f"SELECT {self.columns.sql} FROM {self.table} WHERE {where} ORDER BY {order_by}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        make = cast(Any, self.row)._make  # a namedtuple class
        return [make(self.columns.values(r)) for r in fetch(sql, params)]


def placeholders(values: Sequence[Any]) -> str:
    """`%s, %s, ...` for an IN list of `values` (never empty: the caller checks)."""
    return ", ".join(["%s"] * len(values))
