"""Statements bound and prepared on the server, planned once per connection.

Django binds parameters on the client, so PostgreSQL plans every statement afresh:
for the short, indexed statements an API request makes, planning costs as much as
running (a run read 0.6 ms, of which `SELECT 1` is 0.2). A statement whose text is
fixed and which runs on most requests (the transition's commit, the token, the run and
call reads of the decision API) goes through here instead: psycopg prepares it at the
protocol level on its first run on a connection and reuses the plan after. Every other
query keeps client-side binding; AIRLOCK_PREPARED_STATEMENTS=0 sends these the plain
way too, for a pooler that cannot keep prepared statements (docs/deployment.md).

Only fixed text belongs here: each distinct text is a statement kept on every
connection (psycopg keeps at most 100 and deallocates the oldest beyond that).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import functools
import re
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from django.conf import settings
from django.db import connection

# Texts whose conversion a cursor keeps (psycopg keeps at most 100 prepared statements).
CONVERTED_MAX = 100

# The prepared-statement cursors of each database connection, reused by every statement
# (the first by all; more only for a pipeline's statements, `pipelined`).
_cursors: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def fetchall(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of `sql` (`%s` or `%(name)s` placeholders), prepared on PostgreSQL
    unless AIRLOCK_PREPARED_STATEMENTS is off; plain elsewhere."""
    with _executed(sql, params) as cursor:
        return list(cursor.fetchall())


def fetchone(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The first row of `sql`, as `fetchall` runs it (for a statement that writes)."""
    with _executed(sql, params) as cursor:
        return cursor.fetchone()  # type: ignore[no-any-return]


@contextlib.contextmanager
def _executed(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Iterator[Any]:
    """A cursor that has run `sql`: the connection's prepared-statement cursor (left
    open: it lives as long as its connection), or a plain one closed after."""
    with contextlib.nullcontext(_cursor()) if preparing() else connection.cursor() as cursor:
        cursor.execute(sql, params)
        yield cursor


def fetch_together(statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
    """The rows of each statement (fixed texts, as `fetchall` takes), every one prepared
    and all sent in one round trip. Independent reads only: each statement is its own,
    with its own snapshot, and a failing one fails the lot. Without preparing (SQLite,
    AIRLOCK_PREPARED_STATEMENTS off) they run one after another."""
    if not preparing():
        return [fetchall(sql, params) for sql, params in statements]
    return [cast(list[tuple[Any, ...]], rows) for rows in pipelined([(sql, params, True) for sql, params in statements])]


# A pipeline's statement: text, values (`%s` or `%(name)s` placeholders), prepared.
Statement = tuple[str, Sequence[Any] | Mapping[str, Any] | None, bool]


def pipelined(statements: Sequence[Statement]) -> list[list[tuple[Any, ...]] | None]:
    """Each (text, values, prepared) statement in order, all in one round trip (psycopg's
    pipeline; PostgreSQL with preparing on): the rows of each prepared one, each read on
    a prepared cursor of its own, and None for the others (bound on the client, not
    kept prepared; their results are dropped). Each statement has its own snapshot."""
    kept = [i for i, (_sql, _params, keep) in enumerate(statements) if keep]
    cursors = {i: _cursor(n) for n, i in enumerate(kept)}
    # A plain cursor only for statements bound on the client (none in most pipelines).
    plain: contextlib.AbstractContextManager[Any] = (
        connection.cursor() if len(kept) < len(statements) else contextlib.nullcontext()
    )
    with plain as other, connection.wrap_database_errors, connection.connection.pipeline():
        for i, (sql, params, _keep) in enumerate(statements):
            (cursors[i] if i in cursors else other).execute(sql, params)
    return [list(cursors[i].fetchall()) if i in cursors else None for i in range(len(statements))]


def beside(first: Statement, second: Statement) -> Statement:
    """One prepared statement reading the single row of each: `first`'s columns, then
    `second`'s. A pipeline's statement costs the server a bind and an execution and the
    client a result, whatever it reads; two independent one-row reads of the same moment
    (the same snapshot) go as one. Their placeholders (`%s` or `%(name)s`) are renamed
    apart, so the two keep their own values."""
    values: dict[str, Any] = {}
    parts = [_named(sql, params, f"s{n}_", values) for n, (sql, params, _kept) in enumerate((first, second))]
    return f"SELECT * FROM ({parts[0]}) first_, ({parts[1]}) second_", values, True


def _named(sql: str, params: Sequence[Any] | Mapping[str, Any] | None, prefix: str, into: dict[str, Any]) -> str:
    """`sql` with each placeholder named `prefix`..., its value put in `into`."""
    positional = iter(params) if isinstance(params, Sequence) else None

    def rename(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%%"
        name = match.group(1)
        if name is None:
            assert positional is not None, "a %s placeholder with named values"
            key = f"{prefix}{len(into)}"
            into[key] = next(positional)
        else:
            key = prefix + name
            into[key] = cast(Mapping[str, Any], params)[name]
        return f"%({key})s"

    return _PLACEHOLDER.sub(rename, sql)


_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s|%s")


def preparing() -> bool:
    """Whether statements are prepared here (PostgreSQL, AIRLOCK_PREPARED_STATEMENTS)."""
    return bool(settings.AIRLOCK_PREPARED_STATEMENTS) and connection.vendor == "postgresql"


def _cursor(n: int = 0) -> Any:
    """The connection's `n`th prepared-statement cursor (a pipeline's statements each
    need their own: a cursor holds one result)."""
    connection.ensure_connection()
    raw = connection.connection
    kept = _cursors.get(raw)
    if kept is None:
        kept = _cursors[raw] = []
    while len(kept) <= n:
        kept.append(_cursor_class()(raw))
    # Django's wrapper keeps its error translation, execute wrappers and query log; it
    # is not closed, so the cursor lives as long as its connection.
    return connection._prepare_cursor(kept[n])


@functools.cache
def _cursor_class() -> type:
    # Imported late: the module needs psycopg, which SQLite deployments may lack.
    from django.db.backends.postgresql.base import ServerBindingCursor

    fast = _psycopg_timestamptz_loader()

    class PreparedCursor(ServerBindingCursor):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._converted: dict[Any, Any] = {}
            if self.connection.info.timezone is dt.UTC and connection.timezone is dt.UTC:
                # Django loads every timestamptz through a Python subclass of psycopg's
                # loader, to give it Django's zone; psycopg's own (C) loader already
                # gives `datetime.UTC` on a UTC session, the same value, at a
                # tenth of the cost (about 4 us a value: a run read has a dozen).
                self.adapters.register_loader("timestamptz", fast)

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            return super().execute(query, params, **kwargs)

        def _convert_query(self, query: Any, params: Any = None) -> Any:
            # psycopg remembers how it turned a text's %s into $1... only for texts up
            # to 4 kB and 50 values (ORMs' INSERTs of many rows would crowd its cache);
            # a history rule set's figures run longer (0.2 ms a call to parse again).
            # Every text here is fixed and few (see the module's note): each is parsed
            # once per connection and its values bound afresh (`dump`, as executemany
            # does for each set of values).
            if params is None:
                return super()._convert_query(query, params)
            done = self._converted.get(query)
            if done is None:
                done = super()._convert_query(query, params)
                if len(self._converted) < CONVERTED_MAX:
                    self._converted[query] = done
                return done
            again = copy.copy(done)
            again.dump(params)
            return again

        def _send_query_prepared(self, name: bytes, pgq: Any, **kwargs: Any) -> None:
            # psycopg keeps the query it sent only when it sends one unprepared; Django's
            # query log (DEBUG, CaptureQueriesContext) reads it there, so it would log
            # None for a prepared statement. Keep it for them (its text has $1...).
            self._query = pgq
            super()._send_query_prepared(name, pgq, **kwargs)

    return PreparedCursor


def _psycopg_timestamptz_loader() -> type:
    """psycopg's own text loader of timestamptz (its C one, with psycopg's binary
    package). Django's zone is `datetime.UTC` only with USE_TZ on and no database
    TIME_ZONE: elsewhere a prepared cursor keeps Django's loader."""
    import psycopg
    from psycopg.pq import Format

    return cast(type, psycopg.adapters.get_loader(psycopg.postgres.types["timestamptz"].oid, Format.TEXT))
