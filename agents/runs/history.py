"""The figures history rules judge with: the queries behind `engine.history.History`.

A history rule counts the **counted calls** of its scope: journal rows (calls that ran,
are running or were approved: a call enters the journal when it is allowed or approved)
and approvals still waiting for a human. Rejected, denied and expired calls never reach
the journal, so they do not count. Scopes: `run` (this run), `caller` (runs of this
profile launched by the same user: for the gateway, that user's stream), `profile`,
`project` (runs of every profile of the project).

Exactness under concurrency (docs/policy.md, "What serialises the count"): every
judgement that counts the same calls takes the same PostgreSQL advisory lock
(`Query.lock_key`) in the transaction that commits its verdict, after the run's own row
and in ascending key order. The decision API reads under those locks (it judges inside
the run's locked transaction); a worker judges outside any transaction, so its commit
takes the locks and reads the figures again (`hold`), and refuses to commit a verdict
whose figures moved (`HistoryMoved`): the worker judges that call again.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import JSONField, Q, QuerySet, Value
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from agents.engine.history import Figures, Query
from agents.lib import prepared
from agents.models import Approval, Run, ToolCall


class HistoryMoved(Exception):
    """The figures a verdict was judged with changed before its commit."""


class StoreHistory:
    """The history of one run's scopes, read from the journal and the approvals.

    `lock`: inside a transaction on PostgreSQL, take the queries' advisory locks before
    reading (the decision API, which commits in the same transaction). `as_of`: history
    as it stood then (a backtest); `exclude_approval`: an approval not to count (the
    pending call a reviewer is editing: it is the call being judged)."""

    def __init__(
        self, run: Run, *, lock: bool = False, as_of: dt.datetime | None = None, exclude_approval: int | None = None
    ) -> None:
        self.run = run
        self.lock = lock
        self.as_of = as_of
        self.exclude_approval = exclude_approval
        # Figures read ahead (`read_ahead`), by query: answered without reading again.
        self.known: dict[Query, Figures] = {}

    def figures(self, queries: Sequence[Query]) -> list[Figures]:
        if queries and all(q in self.known for q in queries):
            return [self.known[q] for q in queries]
        if connection.vendor == "postgresql":
            return self.all_at_once(queries, lock_first=self.lock)
        return [self.one(q) for q in queries]

    def read_ahead(self, queries: Sequence[Query]) -> None:
        """Read the figures of `queries` now (under their locks, with `lock`), for
        `figures` to answer from: the decision API reads them before it judges, once
        the run's row is locked and its policy known."""
        self.known.update(zip(queries, self.figures(queries), strict=True))

    def ahead(self, queries: Sequence[Query]) -> list[prepared.Statement]:
        """The statements that take the locks of `queries` and read their figures on
        the generic plan, for a caller's own pipeline (`prepared.pipelined`, inside the
        locking transaction, PostgreSQL preparing): the decision API sends them after
        the run's lock when it knows the run's policy beforehand. `take` reads their rows."""
        return _on_generic_plan_statements(*self._select(queries), _lock_statement(queries))

    def take(self, queries: Sequence[Query], found: Sequence[list[tuple[Any, ...]] | None]) -> None:
        """The figures of `queries` from the rows of the statements `ahead` gave (the
        second's: the first may have gone in another statement), kept for `figures` to
        answer from."""
        self.known.update((q, _figures(q, value)) for q, value in zip(queries, _take(found), strict=True))

    def scope(self) -> tuple[Any, ...]:
        """What the figures' statement reads of the run: a history over another run with
        the same scope reads the same figures."""
        return self.run.pk, self.run.profile_id, self.run.created_by_id, self.run.profile.project_id

    # -- PostgreSQL: every query in one statement --------------------------------------

    def all_at_once(self, queries: Sequence[Query], *, lock_first: bool = False) -> list[Figures]:
        """The figures of every query in one statement, a scalar subquery per query over
        the journal and the waiting approvals. The same filters as `one` (the ORM's,
        which SQLite uses); the tests run on both.

        Inside a transaction (the decision API's; a worker's commit) the statement is
        prepared on the server (`agents.lib.prepared`, once per connection and rule set:
        its text is the rules' shapes, the call's values parameters) and run on its generic
        plan: planning the nine-odd subqueries of five rules cost 4-5 ms a call, running
        them 0.1-0.5 ms. `_where` writes each query so that its index is the one a
        generic plan takes (docs/performance.md, "History rules"). The advisory locks
        (`lock_first`) with the plan settings, then the statement (which puts the
        settings back as it runs), go in one round trip (`_on_generic_plan`): each is a
        statement of its own with its own snapshot, so the figures are read once the
        locks are held. Elsewhere (a backtest's replay; preparing off): the locks and
        one statement, planned with its values, in one query string."""
        if not queries:
            return []
        sql, params = self._select(queries)
        locking = _lock_statement(queries) if lock_first and connection.in_atomic_block else None
        row: tuple[Any, ...] | None
        if connection.in_atomic_block and prepared.preparing():
            row = _on_generic_plan(sql, params, locking)
        else:
            with connection.cursor() as cursor:
                if locking is None:
                    cursor.execute(sql, params)
                else:
                    cursor.execute(f"{locking[0]}; {sql}", {**locking[1], **params})
                    cursor.nextset()
                row = cursor.fetchone()
        assert row is not None
        return [_figures(q, value) for q, value in zip(queries, row, strict=True)]

    def _select(self, queries: Sequence[Query]) -> tuple[str, dict[str, Any]]:
        """One statement, a column per query (its figure), and its values by name.

        A rule set's text is made once (`_statement`): what the rules fix (tools,
        paths, windows, caps) is written into it as constants, and the values of this
        call (the run's ids, the time, the `same` values) are named parameters, each
        bound once however many queries use it: the bench's five rules bind 9 values
        where they bound 55, each parsed on the server and dumped by psycopg per call."""
        same: list[tuple[str, str]] = []
        shapes = []
        for q in queries:
            slots = []
            for pair in q.same:
                if pair not in same:
                    same.append(pair)
                slots.append((pair[0], same.index(pair)))
            shapes.append((q.scope, q.window, q.tools, tuple(slots), q.count_to, q.sum_path, q.ran))
        sql = _statement(tuple(shapes), self.as_of is not None, self.exclude_approval is not None)
        run = self.run
        values: dict[str, Any] = {
            "run": run.pk, "profile": run.profile_id, "caller": run.created_by_id,
            "now": self.as_of or timezone.now(), "as_of": self.as_of, "exclude": self.exclude_approval,
        }
        if any(q.scope == "project" for q in queries):
            values["project"] = run.profile.project_id
        for n, (path, text) in enumerate(same):
            values[f"v{n}"] = text
            for part in reversed(path.split(".")):  # {"entry": {"order": <the value>}}
                text = f"{{{json.dumps(part)}:{text}}}"
            values[f"c{n}"] = text
        return sql, values

    # -- one query ---------------------------------------------------------------------

    def one(self, q: Query) -> Figures:
        calls = self._filtered(ToolCall.objects.all(), q, prefix="run__")
        waiting = self._waiting(q)
        if q.ran:
            tool = calls.values_list("tool", flat=True).first()
            return Figures(ran=tool)
        if q.sum_path is not None:
            total: float = 0
            count = 0
            for qs in (calls, waiting):
                for value in qs.annotate(h_sum=_key(q.sum_path)).values_list("h_sum", flat=True):
                    count += 1
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        total += value
            return Figures(count=count, total=total)
        cap = q.count_to
        if cap is None:
            return Figures(count=calls.count() + waiting.count())
        found = calls[:cap].count()
        if found < cap:
            found += waiting[: cap - found].count()
        return Figures(count=found)

    def _waiting(self, q: Query) -> QuerySet[Approval]:
        pending = Approval.objects.filter(status="pending")
        if self.as_of is not None:
            # Waiting then: made before (below), decided (if ever) after. A denial is
            # decided as it is made, so it never waited; an approved call's journal row
            # is made when it is approved, so it is counted once either way.
            pending = Approval.objects.filter(Q(decided_at__isnull=True) | Q(decided_at__gt=self.as_of))
        # "Outcome unknown": the call is in the journal already (started), counted there.
        pending = pending.exclude(kind=Approval.Kind.OUTCOME_UNKNOWN)
        if self.exclude_approval is not None:
            pending = pending.exclude(pk=self.exclude_approval)
        return self._filtered(pending, q, prefix="run__")

    def _filtered(self, qs: QuerySet[Any], q: Query, *, prefix: str) -> QuerySet[Any]:
        run = self.run
        if q.scope == "run":
            qs = qs.filter(run_id=run.pk)
        elif q.scope == "caller":
            qs = qs.filter(**{f"{prefix}profile_id": run.profile_id, f"{prefix}created_by_id": run.created_by_id})
        elif q.scope == "profile":
            qs = qs.filter(**{f"{prefix}profile_id": run.profile_id})
        else:
            qs = qs.filter(**{f"{prefix}profile__project_id": run.profile.project_id})
        now = self.as_of or timezone.now()
        if q.window is not None:
            qs = qs.filter(created_at__gte=now - dt.timedelta(seconds=q.window))
        if self.as_of is not None:
            qs = qs.filter(created_at__lt=self.as_of)
        if q.tools:
            names = [t for t in q.tools if not t.endswith("__*")]
            which = Q(tool__in=names) if names else Q()
            for pattern in (t for t in q.tools if t.endswith("__*")):
                which |= Q(tool__startswith=pattern[:-1])
            qs = qs.filter(which)
        for i, (path, text) in enumerate(q.same):
            value = json.loads(text)
            parts = path.split(".")
            if connection.vendor == "postgresql" and _contained(path):
                # `@>` first: the GIN index on args finds the few calls with this value
                # among a scope's thousands; the exact `#>` comparison below decides.
                nested: Any = value
                for part in reversed(parts):
                    nested = {part: nested}
                qs = qs.filter(args__contains=nested)
            qs = qs.alias(**{f"h_same{i}": _key(path)}).filter(**{f"h_same{i}": Value(value, JSONField())})
        return qs


# A query as its statement text sees it: its `same` values as slots of the values (`v0`...).
_Shape = tuple[str, int | None, tuple[str, ...], tuple[tuple[str, int], ...], int | None, str | None, bool]


@functools.lru_cache(maxsize=256)
def _statement(shapes: tuple[_Shape, ...], as_of: bool, exclude: bool) -> str:
    """The figures' text for queries of these shapes (`StoreHistory._select`)."""
    columns: list[str] = []
    for scope, window, tools, same, count_to, sum_path, ran in shapes:
        calls, held = _from("agents_toolcall", scope, same), _from("agents_approval", scope, same)
        journal = _where(scope, window, tools, same, as_of=as_of, waiting=False, exclude=exclude)
        if ran:
            columns.append(f"(SELECT t.tool FROM {calls} WHERE {journal} LIMIT 1)")
            continue
        # A run judges its calls one at a time: none of its own waits meanwhile
        # (but for the call a reviewer edits, which is left out).
        waiting = "false" if scope == "run" else _where(scope, window, tools, same, as_of=as_of, waiting=True, exclude=exclude)
        if sum_path is not None:
            at = _path(sum_path)
            columns.append(
                "(SELECT json_build_array(count(*), coalesce(sum(CASE WHEN jsonb_typeof(v) = 'number'"
                " THEN v::text::numeric END), 0)) FROM ("
                f"SELECT t.args #> {at} AS v FROM {calls} WHERE {journal}"
                f" UNION ALL SELECT t.args #> {at} FROM {held} WHERE {waiting}) s)"
            )
        else:
            # Counted no further than the test needs: each side stops at `cap` rows.
            cap = "" if count_to is None else f" LIMIT {int(count_to)}"
            columns.append(
                f"(SELECT count(*) FROM ((SELECT 1 FROM {calls} WHERE {journal}{cap})"
                f" UNION ALL (SELECT 1 FROM {held} WHERE {waiting}{cap})) s)"
            )
    return "SELECT " + ", ".join(columns)


def _contained(path: str) -> bool:
    """Whether `args @> {...}` can find a `same` value at `path` (no list index in it), so
    the GIN index on args serves its query."""
    return not any(p.isdigit() for p in path.split("."))


def _gin(same: tuple[tuple[str, int], ...]) -> bool:
    """Whether the GIN index on args serves a query (a `same` path without list indexes)."""
    return any(_contained(path) for path, _ in same)


def _from(table: str, scope: str, same: tuple[tuple[str, int], ...]) -> str:
    """The calls of `table` (the journal or the approvals) with their runs, which a scope
    wider than the run filters on. A GIN query's join is on `t.run_id + 0`, which no index
    of the calls serves, so no plan can start from the scope's runs and walk each one's
    calls: a generic plan made with the project's runs estimated at 86 did, 69 ms a rule
    at 100,000 calls where the GIN index finds the few in 0.02 ms."""
    if scope == "run":
        return f"{table} t"
    return f"{table} t JOIN agents_run r ON r.id = {'t.run_id + 0' if _gin(same) else 't.run_id'}"


def _where(
    scope: str, window: int | None, tools: tuple[str, ...], same: tuple[tuple[str, int], ...], *,
    as_of: bool, waiting: bool, exclude: bool,
) -> str:
    where: list[str] = []
    if scope == "run":
        where.append("t.run_id = %(run)s")
    elif scope == "caller":
        where.append("r.profile_id = %(profile)s AND r.created_by_id IS NOT DISTINCT FROM %(caller)s")
    elif scope == "profile":
        where.append("r.profile_id = %(profile)s")
    else:
        where.append("r.profile_id IN (SELECT id FROM agents_agentprofile WHERE project_id = %(project)s)")
    # A `same` query is served by the GIN index on args alone: its tool and time
    # filters are written so no other index can take them (`+ interval '0 s'`, `|| ''`):
    # a generic plan would AND the GIN's few rows with the window's thousands.
    created, tool = ("(t.created_at + interval '0 s')", "(t.tool || '')") if _gin(same) else ("t.created_at", "t.tool")
    if window is not None:
        where.append(f"{created} >= %(now)s - interval '{int(window)} s'")
    if as_of:
        where.append(f"{created} < %(as_of)s")
    if waiting:
        where.append("(t.decided_at IS NULL OR t.decided_at > %(as_of)s)" if as_of else "t.status = 'pending'")
        where.append("t.kind <> 'outcome_unknown'")
        if exclude:
            where.append("t.id <> %(exclude)s")
    if tools:
        names = [t for t in tools if not t.endswith("__*")]
        which = [f"{tool} IN ({', '.join(_text(n) for n in names)})"] if names else []
        for pattern in (t for t in tools if t.endswith("__*")):
            escaped = pattern[:-1].replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")
            which.append(f"{tool} LIKE {_text(escaped + '%')}")
        where.append("(" + " OR ".join(which) + ")")
    for path, n in same:
        if _contained(path):
            # `@>` first: the GIN index finds the few calls with this value.
            where.append(f"t.args @> %(c{n})s::jsonb")
        where.append(f"t.args #> {_path(path)} = %(v{n})s::jsonb")
    return " AND ".join(where)


def _text(value: str) -> str:
    """A rule's text (a tool name, a pattern, a path's key) as an SQL constant: an
    escape string, read the same whatever `standard_conforming_strings` says, with
    `%` doubled for the driver's placeholders."""
    return "E'" + value.replace("\\", "\\\\").replace("'", "''").replace("%", "%%") + "'"


def _path(path: str) -> str:
    """A dotted argument path as the `text[]` constant `#>` takes."""
    return f"ARRAY[{', '.join(_text(p) for p in path.split('.'))}]::text[]"


# The figures' statement runs on a generic plan, the one whose indexes `_where` chose:
# the settings are changed for that statement only, in the statement before it (which
# keeps their values in placeholder settings and takes the advisory locks, when it is
# given them), and put back by the figures' statement itself, in columns after the
# figures: a plan is chosen (and made) when the statement is bound, before it runs, so
# what it sets as it runs is for the statements after it. All transaction-local.
_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}
_KEEP = ", ".join(f"set_config('airlock.{name}', current_setting('{name}'), true)" for name in _SETTINGS)
_SET = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in _SETTINGS.items())
_PUT_BACK = ", ".join(f"set_config('{name}', current_setting('airlock.{name}'), true)" for name in _SETTINGS)


def _generic_plan(locking: tuple[str, dict[str, Any]] | None) -> tuple[str, dict[str, Any] | None]:
    """The statement before the figures': keep the plan settings, set them, and take
    the advisory locks of `locking` (`_lock_statement`) if given."""
    locks = "" if locking is None else f", (SELECT count(*) FROM ({locking[0]}) locked)"
    return f"WITH was AS MATERIALIZED (SELECT {_KEEP}) SELECT {_SET}{locks} FROM was", None if locking is None else locking[1]


def _on_generic_plan_statements(
    sql: str, params: dict[str, Any], locking: tuple[str, dict[str, Any]] | None
) -> list[prepared.Statement]:
    """The figures' statement `sql` with the plan settings and the advisory locks of
    `locking` before it, putting the settings back as it runs: two statements for one
    pipeline, the second one's row the figures (and then the settings, `_take`). Both
    are prepared: the first has a fixed text (the keys are a value), and planning it
    afresh, with a third statement that put the settings back, cost a proposal about
    0.1 ms."""
    return [(*_generic_plan(locking), True), (f"{sql}, {_PUT_BACK}", params, True)]


def _on_generic_plan(sql: str, params: dict[str, Any], locking: tuple[str, dict[str, Any]] | None) -> tuple[Any, ...]:
    """The figures' statement `sql` run on its generic plan, in one round trip
    (`prepared.pipelined`): the figures' row."""
    return _take(prepared.pipelined(_on_generic_plan_statements(sql, params, locking)))


def _take(found: Sequence[list[tuple[Any, ...]] | None]) -> tuple[Any, ...]:
    """The figures of `_on_generic_plan_statements`' rows: its second's, without the
    settings it put back."""
    row = found[1]
    assert row
    return row[0][: -len(_SETTINGS)]


def _figures(q: Query, value: Any) -> Figures:
    if q.ran:
        return Figures(ran=value)
    if q.sum_path is not None:
        count, total = json.loads(value) if isinstance(value, str) else value
        return Figures(count=count, total=total)
    return Figures(count=value if q.count_to is None else min(value, q.count_to))


def _key(path: str) -> KeyTransform:
    """The value at a dotted path of `args` (a number indexes a list), as `#>` reads it."""
    expr: Any = "args"
    for part in path.split("."):
        expr = KeyTransform(part, expr)
    return expr


def _lock_statement(queries: Sequence[Query]) -> tuple[str, dict[str, Any]] | None:
    keys = sorted({k for k in (q.lock_key() for q in queries) if k is not None})
    if not keys:
        return None
    # All at once, in ascending order (a plain SELECT evaluates the calls in order).
    return "SELECT pg_advisory_xact_lock(k) FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS t(k, n) ORDER BY n", {"keys": keys}


def lock(queries: Sequence[Query]) -> None:
    """Take the advisory locks of these queries in ascending order, until the end of
    the current transaction (PostgreSQL only; SQLite takes one writer at a time)."""
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        return
    locking = _lock_statement(queries)
    if locking is not None:
        with connection.cursor() as cursor:
            cursor.execute(*locking)


def hold(run: Run, judged: Sequence[tuple[Query, Figures]]) -> None:
    """Inside the transaction that commits a worker's verdict: lock the run's row, then
    the history's advisory locks, and check the figures the verdict was judged with are
    still the figures (HistoryMoved if not). Only queries a lock serialises are read
    again: a run scope's calls only change under the run's own row lock."""
    locked = [(q, f) for q, f in judged if q.lock_key() is not None]
    if not locked:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM agents_run WHERE id = %s FOR UPDATE", [run.pk])
    lock([q for q, _ in locked])
    now = StoreHistory(run).figures([q for q, _ in locked])
    if now != [was for _, was in locked]:
        raise HistoryMoved(f"run {run.pk}: the figures of a history rule moved before the commit")

