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

_JOURNAL = "agents_toolcall t JOIN agents_run r ON r.id = t.run_id"
_WAITING = "agents_approval t JOIN agents_run r ON r.id = t.run_id"


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

    def ahead(self, queries: Sequence[Query]) -> list[tuple[str, Sequence[Any] | None, bool]]:
        """The statements that take the locks of `queries` and read their figures on
        the generic plan, for a caller's own pipeline (`prepared.pipelined`, inside the
        locking transaction, PostgreSQL preparing): the decision API sends them after
        the run's lock when it knows the run's policy beforehand. `take` reads their rows."""
        return _on_generic_plan_statements(*self._select(queries), _lock_statement(queries))

    def take(self, queries: Sequence[Query], found: Sequence[list[tuple[Any, ...]] | None]) -> None:
        """The figures of `queries` from the rows of the statements `ahead` gave, kept for
        `figures` to answer from."""
        row = found[1]
        assert row
        self.known.update((q, _figures(q, value)) for q, value in zip(queries, row[0], strict=True))

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
        its text is the rules' shapes, every value a parameter) and run on its generic
        plan: planning the nine-odd subqueries of five rules cost 4-5 ms a call, running
        them 0.1-0.5 ms. `_where` writes each query so that its index is the one a
        generic plan takes (docs/performance.md, "History rules"). The advisory locks
        (`lock_first`), the plan settings, the statement and the settings' reset go in
        one round trip (`_on_generic_plan`): each is a statement of its own with its
        own snapshot, so the figures are read once the locks are held. Elsewhere (a
        backtest's replay; preparing off): the locks and one statement, planned with
        its values, in one query string."""
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
                    cursor.execute(f"{locking[0]}; {sql}", [*locking[1], *params])
                    cursor.nextset()
                row = cursor.fetchone()
        assert row is not None
        return [_figures(q, value) for q, value in zip(queries, row, strict=True)]

    def _select(self, queries: Sequence[Query]) -> tuple[str, list[Any]]:
        """One statement: a column per query, its figure."""
        columns: list[str] = []
        params: list[Any] = []
        for q in queries:
            journal, jp = self._where(q, waiting=False)
            if q.ran:
                columns.append(f"(SELECT t.tool FROM {_JOURNAL} WHERE {journal} LIMIT 1)")
                params += jp
                continue
            # A run judges its calls one at a time: none of its own waits meanwhile
            # (but for the call a reviewer edits, which is left out).
            waiting, wp = self._where(q, waiting=True) if q.scope != "run" else ("false", [])
            if q.sum_path is not None:
                path = q.sum_path.split(".")
                columns.append(
                    "(SELECT json_build_array(count(*), coalesce(sum(CASE WHEN jsonb_typeof(v) = 'number'"
                    " THEN v::text::numeric END), 0)) FROM ("
                    f"SELECT t.args #> %s AS v FROM {_JOURNAL} WHERE {journal}"
                    f" UNION ALL SELECT t.args #> %s FROM {_WAITING} WHERE {waiting}) s)"
                )
                params += [path, *jp, path, *wp]
            else:
                # Counted no further than the test needs: each side stops at `cap` rows.
                cap = "" if q.count_to is None else " LIMIT %s"
                columns.append(
                    f"(SELECT count(*) FROM ((SELECT 1 FROM {_JOURNAL} WHERE {journal}{cap})"
                    f" UNION ALL (SELECT 1 FROM {_WAITING} WHERE {waiting}{cap})) s)"
                )
                capped = [] if q.count_to is None else [int(q.count_to)]
                params += [*jp, *capped, *wp, *capped]
        return "SELECT " + ", ".join(columns), params

    def _where(self, q: Query, *, waiting: bool) -> tuple[str, list[Any]]:
        run = self.run
        where: list[str] = []
        params: list[Any] = []
        if q.scope == "run":
            where.append("t.run_id = %s")
            params.append(run.pk)
        elif q.scope == "caller":
            where.append("r.profile_id = %s AND r.created_by_id IS NOT DISTINCT FROM %s")
            params += [run.profile_id, run.created_by_id]
        elif q.scope == "profile":
            where.append("r.profile_id = %s")
            params.append(run.profile_id)
        else:
            where.append("r.profile_id IN (SELECT id FROM agents_agentprofile WHERE project_id = %s)")
            params.append(run.profile.project_id)
        # A `same` query is served by the GIN index on args alone: its tool and time
        # filters are written so no other index can take them (`+ interval '0 s'`, `|| ''`):
        # a generic plan would AND the GIN's few rows with the window's thousands.
        created, tool = ("(t.created_at + interval '0 s')", "(t.tool || '')") if _gin(q) else ("t.created_at", "t.tool")
        now = self.as_of or timezone.now()
        if q.window is not None:
            where.append(f"{created} >= %s")
            params.append(now - dt.timedelta(seconds=q.window))
        if self.as_of is not None:
            where.append(f"{created} < %s")
            params.append(self.as_of)
        if waiting:
            if self.as_of is None:
                where.append("t.status = 'pending'")
            else:
                where.append("(t.decided_at IS NULL OR t.decided_at > %s)")
                params.append(self.as_of)
            where.append("t.kind <> 'outcome_unknown'")
            if self.exclude_approval is not None:
                where.append("t.id <> %s")
                params.append(self.exclude_approval)
        if q.tools:
            names = [t for t in q.tools if not t.endswith("__*")]
            which = [f"{tool} = ANY(%s)"] if names else []
            params += [names] if names else []
            for pattern in (t for t in q.tools if t.endswith("__*")):
                which.append(f"{tool} LIKE %s")
                params.append(pattern[:-1].replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%")
            where.append("(" + " OR ".join(which) + ")")
        for path, text in q.same:
            parts = path.split(".")
            if not any(p.isdigit() for p in parts):
                # `@>` first: the GIN index finds the few calls with this value.
                nested: Any = json.loads(text)
                for part in reversed(parts):
                    nested = {part: nested}
                where.append("t.args @> %s::jsonb")
                params.append(json.dumps(nested))
            where.append("t.args #> %s = %s::jsonb")
            params += [parts, text]
        return " AND ".join(where), params

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
            if connection.vendor == "postgresql" and not any(p.isdigit() for p in parts):
                # `@>` first: the GIN index on args finds the few calls with this value
                # among a scope's thousands; the exact `#>` comparison below decides.
                nested: Any = value
                for part in reversed(parts):
                    nested = {part: nested}
                qs = qs.filter(args__contains=nested)
            qs = qs.alias(**{f"h_same{i}": _key(path)}).filter(**{f"h_same{i}": Value(value, JSONField())})
        return qs


# The figures' statement runs on a generic plan, the one whose indexes `_where` chose:
# the settings are changed for that statement only, in the statement before it (which
# keeps their values in placeholder settings and takes the advisory locks, when it is
# given them), and put back by the statement after it, all transaction-local.
_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}
_KEEP = ", ".join(f"set_config('airlock.{name}', current_setting('{name}'), true)" for name in _SETTINGS)
_SET = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in _SETTINGS.items())
_PUT_BACK = "SELECT " + ", ".join(f"set_config('{name}', current_setting('airlock.{name}'), true)" for name in _SETTINGS)


def _generic_plan(locking: tuple[str, list[Any]] | None) -> tuple[str, list[Any]]:
    """The statement before the figures': keep the plan settings, set them, and take
    the advisory locks of `locking` (`_lock_statement`) if given."""
    locks = "" if locking is None else f", (SELECT count(*) FROM ({locking[0]}) locked)"
    return f"WITH was AS MATERIALIZED (SELECT {_KEEP}) SELECT {_SET}{locks} FROM was", [] if locking is None else locking[1]


def _on_generic_plan_statements(
    sql: str, params: list[Any], locking: tuple[str, list[Any]] | None
) -> list[tuple[str, Sequence[Any] | None, bool]]:
    """The figures' statement `sql`, prepared, with the plan settings and the advisory
    locks of `locking` before it and the settings put back after it: three statements
    for one pipeline, the second one's row the figures."""
    return [(*_generic_plan(locking), False), (sql, params, True), (_PUT_BACK, None, False)]


def _on_generic_plan(sql: str, params: list[Any], locking: tuple[str, list[Any]] | None) -> tuple[Any, ...]:
    """The figures' statement `sql` run on its generic plan, in one round trip
    (`prepared.pipelined`): the figures' row."""
    row = prepared.pipelined(_on_generic_plan_statements(sql, params, locking))[1]
    assert row
    return row[0]


def _gin(q: Query) -> bool:
    """Whether the GIN index on args serves `q` (a `same` path without list indexes)."""
    return any(not any(p.isdigit() for p in path.split(".")) for path, _ in q.same)


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


def _lock_statement(queries: Sequence[Query]) -> tuple[str, list[Any]] | None:
    keys = sorted({k for k in (q.lock_key() for q in queries) if k is not None})
    if not keys:
        return None
    # All at once, in ascending order (a plain SELECT evaluates the calls in order).
    return "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(k, n) ORDER BY n", [keys]


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

