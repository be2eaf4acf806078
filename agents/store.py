"""The only code that turns engine results into rows, and rows back into engine state.

Every transition is one database transaction, committed only if the run's `version` is
still the one the engine read (optimistic concurrency).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import functools
import json
import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from agents import faults, outbox, rows, telemetry
from agents.engine import patch, states
from agents.engine.protocols import Decision, Deps, JournalEntry, ModelClient, ModelRequest, ThreadRunner
from agents.engine.registry import Registry, ToolContext, ToolSpec
from agents.engine.step import Move, Outcome, RunState, fail, step
from agents.logs import bind_run
from agents.models import Approval, Grant, Message, OutboxEvent, Run, ToolCall, Transition

log = logging.getLogger("airlock.store")

Events = tuple[outbox.Event, ...]
# States a worker advances; awaiting_approval waits for a reviewer (or the deadline).
ADVANCING = (states.QUEUED, states.PLANNING, states.ACTING)


class StaleRun(Exception):
    """Someone else committed a transition of this run first."""


def worker_name() -> str:
    """This thread's name as a lease owner: host, process and thread.

    A threaded worker drives many runs in one process; were the owner only the process,
    a duplicate wake-up on a second thread would pass `claim`'s "we hold it already"
    test and drive the run beside the first thread.
    """
    return f"worker:{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


def release_connection() -> None:
    """Hand this thread's database connection back before it waits (a model call, a
    tool, a sleep), so a worker's connections follow its database work, not its runs.

    With the pool (PostgreSQL) the connection goes back to the pool; without one it is
    closed and the next query opens another. Inside a transaction (a test's, or an
    eager task inside a request) nothing happens: the caller owns that connection.
    """
    if not connection.in_atomic_block:
        connection.close()


# -- text PostgreSQL can store -------------------------------------------------------


def clean(value: Any) -> Any:
    """NUL bytes and lone surrogates (invalid UTF-8) replaced, and NaN and infinities
    (which jsonb refuses) written as text ("nan", "inf"), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {clean(str(k)): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return clean(str(value))


def clean_json(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`clean(value)` with its JSON text. The text is checked first: the engine state
    is almost always clean, and one json.dumps costs less than walking it."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # a NaN takes the walk below
    except (TypeError, ValueError):
        text = None
    if text is not None and "\\u0000" not in text:  # json.dumps escapes NUL
        try:
            text.encode("utf-8")  # a lone surrogate cannot be encoded
            return value, text
        except UnicodeEncodeError:
            pass
    value = clean(value)
    return value, json.dumps(value, ensure_ascii=False)


def bounded_result(result: Any) -> tuple[Any, int, bool]:
    """The journal keeps up to AIRLOCK_JOURNAL_MAX_CHARS of a result's JSON."""
    result = clean(result)
    text = json.dumps(result, ensure_ascii=False)
    limit = settings.AIRLOCK_JOURNAL_MAX_CHARS
    if len(text) <= limit:
        return result, len(text), False
    ok = bool(isinstance(result, dict) and result.get("ok"))
    kept = {"ok": ok, "truncated": True, "result_json_prefix": text[:limit]}
    return kept, len(text), True


# -- rows <-> engine state -----------------------------------------------------------


def load(run: Run) -> RunState:
    return RunState.from_json(run.engine, Message.engine_transcript(run))


_RUN = rows.Joined(Run, ["profile"], "a.id = %s")


def read_run(run_id: int) -> Run | None:
    """The run with its profile (what a driver needs), or None if there is no such run:
    `Run.objects.select_related("profile").get()` without building the query each time."""
    found = _RUN.fetch([run_id])
    return found[0] if found else None


def cache_fields(state: RunState, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run row's cache of `state`; `engine` is its cleaned engine JSON if known."""
    return {
        "state": state.state,
        "steps": state.steps,
        "cost_micros": state.cost_micros,
        "cost_unknown": state.cost_unknown,
        "tokens": state.tokens,
        "tainted": state.tainted,
        "answer": clean(state.answer),
        "error": clean(state.error),
        "engine": clean(state.engine_json()) if engine is None else engine,
        "messages_count": len(state.messages),
    }


def _message_rows(start: int, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fields of the rows for appended messages, but the run and seq."""
    return [
        {
            "index": start + i,
            "role": m["role"],
            "content": clean(m.get("content") or ""),
            "tool_calls": clean(m.get("tool_calls")),
            "tool_call_id": m.get("tool_call_id", ""),
            "name": m.get("name", ""),
        }
        for i, m in enumerate(messages)
    ]


def reserve_id(run: Run) -> int:
    """Give a new, unsaved run its id before `create` writes it (the engine state
    carries the id). PostgreSQL hands out the sequence's next value, so the run is
    written by one INSERT; elsewhere the row is inserted now and `create` updates it."""
    if connection.vendor == "postgresql":
        table, column = Run._meta.db_table, Run._meta.pk.column
        with connection.cursor() as cursor:
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, %s))", [table, column])
            run.pk = cursor.fetchone()[0]
    else:
        run.deadline = timezone.now()  # a placeholder until `create` writes the real one
        run.save()
    return run.pk


def create(run: Run, state: RunState, *, actor: str) -> Run:
    """Insert a new run (its id from `reserve_id`) with its launch transition (seq 1)
    and first messages."""
    with transaction.atomic():
        for name, value in cache_fields(state).items():
            setattr(run, name, value)
        run.version = 1
        run.deadline = dt.datetime.fromtimestamp(state.deadline, tz=dt.UTC)
        # An id set by hand would make save() try an UPDATE first: say it is new.
        run.save(force_insert=run._state.adding)
        Transition.objects.create(
            run=run, seq=1, from_state="", to_state=state.state, kind="launch",
            payload={"patch": run.engine}, actor=actor,
        )
        Message.objects.bulk_create([Message(run=run, seq=1, **m) for m in _message_rows(0, state.messages)])
    return run


def commit(
    run: Run,
    before: RunState,
    after: RunState,
    t: Move,
    *,
    actor: str,
    lease_owner: str | None = None,
    claim: bool = False,
    user: Any = None,
) -> None:
    """Write one transition and its effects atomically, or raise StaleRun.

    A worker passes its `lease_owner`: the same update renews its lease, so a long run
    costs no extra commit to keep it. With `claim` the update also takes the lease, on
    claim()'s terms (free, expired or ours), and raises StaleRun if someone else holds
    it: a worker picking up a queued run needs no claim commit of its own. On
    PostgreSQL the whole transition is one statement (one round trip); elsewhere it is
    one ORM transaction. Both write the same rows. `user` is the person behind a grant
    or a revocation.
    """
    now = timezone.now()
    engine, engine_text = clean_json(after.engine_json())
    cached = cache_fields(after, engine)
    if lease_owner is not None:
        # A run that ends gives its lease back in the same update: no release commit.
        ends = after.state in states.TERMINAL
        cached["lease_owner"] = None if ends else lease_owner
        cached["lease_expires"] = None if ends else now + dt.timedelta(seconds=settings.AIRLOCK_LEASE_SECONDS)
    cached["updated_at"] = now
    cached["finished_at"] = now if after.state in states.TERMINAL else None
    # Progress: the poison count (claims that died without a transition) starts over.
    cached["claims_without_progress"] = 0
    row = {
        "from_state": t.from_state, "to_state": t.to_state, "kind": t.kind,
        # `run.engine` is the stored cache of `before` (the version check below makes
        # sure of it), so replaying the patch onto it reproduces the new cache exactly.
        "payload": {"patch": patch.diff(run.engine, engine), **clean(t.detail)}, "cost_micros": t.cost_micros, "tokens": t.tokens,
        "duration_ms": t.duration_ms, "actor": actor,
    }
    messages = _message_rows(len(before.messages), t.messages)
    # Outbox rows go in the same transaction; most transitions cause no event.
    events = outbox.events_for(t)
    if t.intent is not None:
        faults.crash_point("before_intent_commit")
    # Grants are rare, human-paced transitions: they take the ORM path.
    one_statement = t.grant is None and t.grant_revoke is None
    claimant = lease_owner if claim else None
    if one_statement and connection.vendor == "postgresql" and settings.AIRLOCK_STORE_ONE_STATEMENT:
        seq = _commit_statement(run, cached, engine_text, row, messages, t, now, events, claimant)
    else:
        seq = _commit_orm(run, cached, row, messages, t, now, events, claimant, user)
    if seq is None:
        # Another worker (or a reviewer, or the sweeper) committed first, or holds the
        # lease we meant to claim; their transition stands and nothing of ours was written.
        raise StaleRun(f"run {run.pk} moved past version {run.version} or is driven by another worker")
    if events:
        # Right away when we are not inside an outer transaction (a worker), else when
        # the caller's (a decision's) commits.
        outbox.wake_after_commit()
    for name, value in cached.items():
        setattr(run, name, value)
    run.version = seq
    log.info(
        "committed run=%s seq=%s %s->%s kind=%s actor=%s",
        run.pk, seq, t.from_state, t.to_state, t.kind, actor,
    )
    if telemetry.enabled():
        telemetry.transition_committed(run, before, after, t)
    if t.intent is not None:
        faults.crash_point("after_intent_commit")
    faults.crash_point("after_transition_commit")


def _commit_orm(
    run: Run,
    cached: dict[str, Any],
    row: dict[str, Any],
    messages: list[dict[str, Any]],
    t: Move,
    now: dt.datetime,
    events: Events,
    claimant: str | None,
    user: Any = None,
) -> int | None:
    with transaction.atomic():
        current = Run.objects.filter(pk=run.pk, version=run.version)
        if claimant is not None:
            current = current.filter(_lease_free(claimant, now))
        updated = current.update(version=F("version") + 1, **cached)
        if updated != 1:
            return None
        seq = run.version + 1
        Transition.objects.create(run=run, seq=seq, **row)
        Message.objects.bulk_create([Message(run=run, seq=seq, **m) for m in messages])
        _apply_effects(run, t, now, events, user)
    return seq


def _apply_effects(run: Run, t: Move, now: dt.datetime, events: Events, user: Any = None) -> None:
    if t.intent is not None:
        i = t.intent
        # A retried approval can meet an intent that already exists: keep the first.
        ToolCall.objects.bulk_create([ToolCall(run=run, **_intent_fields(i))], ignore_conflicts=True)
    if t.journal_reset is not None:
        ToolCall.objects.filter(idempotency_key=t.journal_reset).update(status="intended", result=None)
    if t.journal_result is not None:
        ToolCall.objects.filter(idempotency_key=t.journal_result["key"]).update(
            **_result_fields(t.journal_result), finished_at=now
        )
    created = closed = None
    if t.approval is not None:
        created = Approval.objects.create(run=run, **_approval_fields(t.approval, now)).pk
    if t.approval_close is not None:
        pending = Approval.objects.pending().filter(run=run)
        if events:
            # Locked, so the update below closes exactly these (a decision racing us waits).
            closed = list(pending.select_for_update().values_list("pk", flat=True))
            pending = Approval.objects.filter(pk__in=closed)
        pending.update(status=t.approval_close, decided_at=now)
    if t.grant is not None:
        g = t.grant
        # The decision's approval: decided in this same transaction, the newest of the call.
        approval = Approval.objects.filter(run=run, call_id=t.detail.get("call_id", ""), kind="policy").order_by("-pk").first()
        Grant.objects.create(
            run=run, number=g["n"], approval=approval, tool=g["tool"][:100], args=clean(g.get("args")), by=user
        )
    if t.grant_revoke is not None:
        Grant.objects.filter(run=run, number=t.grant_revoke, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=user
        )
    if events:
        OutboxEvent.objects.bulk_create(outbox.rows(run.pk, events, created=created, closed=closed or [], now=now))


def _intent_fields(i: dict[str, Any]) -> dict[str, Any]:
    return {
        "idempotency_key": i["key"], "fingerprint": i["fp"], "step": i["step"], "call_id": i["call_id"][:200],
        "tool": i["tool"][:100], "args": clean(i["args"]),
    }


def _result_fields(r: dict[str, Any]) -> dict[str, Any]:
    result, chars, truncated = bounded_result(r["result"])
    return {"status": r["status"], "result": result, "result_chars": chars, "result_truncated": truncated}


def _approval_fields(a: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    return {
        "kind": a["kind"], "idempotency_key": a["key"], "call_id": a["call_id"][:200], "step": a["step"],
        "tool": a["tool"][:100], "args": clean(a["args"]), "risk": a["risk"], "reason": clean(a["reason"]),
        "taint_source": clean(a["taint_source"]), "rule": clean(a.get("rule")), "required": a.get("required", 1),
        "status": a["status"], "decided_at": now if a["status"] != Approval.Status.PENDING else None,
        "expires_at": _moment(a.get("expires_at")),
    }


def _moment(epoch: float | None) -> dt.datetime | None:
    return None if epoch is None else dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


def _commit_statement(
    run: Run, cached: dict[str, Any], engine_text: str, row: dict[str, Any], messages: list[dict[str, Any]], t: Move,
    now: dt.datetime, events: Events, claimant: str | None,
) -> int | None:
    """The transition as one PostgreSQL statement of data-modifying CTEs.

    Every insert selects FROM the version-checked run update, so when another actor
    moved the run first the update matches nothing and nothing else is written.
    """
    j = json.dumps
    params: list[Any] = [engine_text if k == "engine" else v for k, v in cached.items()]
    sets = ", ".join(f'"{k}" = %s' + ("::jsonb" if k == "engine" else "") for k in cached)
    claims = ' AND ("lease_owner" IS NULL OR "lease_expires" < %s OR "lease_owner" = %s)' if claimant else ""
    sql = [f'WITH r AS (UPDATE agents_run SET "version" = "version" + 1, {sets} WHERE "id" = %s AND "version" = %s{claims} RETURNING "id", "version")']
    params += [run.pk, run.version, *((now, claimant) if claimant else ())]
    sql.append(
        ", t AS (INSERT INTO agents_transition (run_id, seq, from_state, to_state, kind, payload, cost_micros, tokens,"
        " duration_ms, actor, created_at) SELECT r.id, r.version, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s FROM r)"
    )
    params += [row["from_state"], row["to_state"], row["kind"], j(row["payload"]), row["cost_micros"], row["tokens"],
               row["duration_ms"], row["actor"], now]
    if messages:
        values = ", ".join(["(%s::int, %s, %s, %s::jsonb, %s, %s)"] * len(messages))
        sql.append(
            ', m AS (INSERT INTO agents_message (run_id, "index", seq, role, content, tool_calls, tool_call_id, name,'
            f" created_at) SELECT r.id, v.i, r.version, v.role, v.content, v.tc, v.tcid, v.name, %s FROM r, (VALUES {values})"
            " AS v(i, role, content, tc, tcid, name))"
        )
        params.append(now)
        for m in messages:
            tool_calls = m["tool_calls"]
            params += [m["index"], m["role"], m["content"], None if tool_calls is None else j(tool_calls), m["tool_call_id"], m["name"]]
    if t.intent is not None:
        f = _intent_fields(t.intent)
        sql.append(
            ", i AS (INSERT INTO agents_toolcall (run_id, idempotency_key, fingerprint, step, call_id, tool, args, status,"
            " result_chars, result_truncated, attempts, created_at) SELECT r.id, %s, %s, %s, %s, %s, %s::jsonb,"
            " 'intended', 0, false, 0, %s FROM r ON CONFLICT (idempotency_key) DO NOTHING)"
        )
        params += [f["idempotency_key"], f["fingerprint"], f["step"], f["call_id"], f["tool"], j(f["args"]), now]
    if t.journal_reset is not None:
        sql.append(
            ", jr AS (UPDATE agents_toolcall SET status = 'intended', result = NULL"
            " WHERE idempotency_key = %s AND EXISTS (SELECT 1 FROM r))"
        )
        params.append(t.journal_reset)
    if t.journal_result is not None:
        f = _result_fields(t.journal_result)
        sql.append(
            ", jx AS (UPDATE agents_toolcall SET status = %s, result = %s::jsonb, result_chars = %s,"
            " result_truncated = %s, finished_at = %s WHERE idempotency_key = %s AND EXISTS (SELECT 1 FROM r))"
        )
        params += [f["status"], j(f["result"]), f["result_chars"], f["result_truncated"], now, t.journal_result["key"]]
    if t.approval is not None:
        f = _approval_fields(t.approval, now)
        sql.append(
            ", a AS (INSERT INTO agents_approval (run_id, kind, idempotency_key, call_id, step, tool, args, risk, reason,"
            " taint_source, rule, required, status, decision, decided_at, note, expires_at, round, created_at)"
            " SELECT r.id, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, %s::jsonb, %s, %s, '', %s, '', %s, 0, %s"
            " FROM r RETURNING id)"
        )
        params += [f["kind"], f["idempotency_key"], f["call_id"], f["step"], f["tool"], j(f["args"]), f["risk"],
                   f["reason"], None if f["taint_source"] is None else j(f["taint_source"]),
                   None if f["rule"] is None else j(f["rule"]), f["required"], f["status"], f["decided_at"],
                   f["expires_at"], now]
    if t.approval_close is not None:
        sql.append(
            ", ac AS (UPDATE agents_approval SET status = %s, decided_at = %s"
            " WHERE run_id = %s AND status = 'pending' AND EXISTS (SELECT 1 FROM r) RETURNING id)"
        )
        params += [t.approval_close, now, run.pk]
    if events:
        # One insert, its rows in the events' order. The approval an event is about
        # comes from the CTE that wrote it (or, for a decision, the run's newest
        # approval); no such row, no event.
        selects = []
        for e in events:
            subject, source = {
                None: ("NULL", "r"),
                "created": ("a.id", "r, a"),
                "closed": ("ac.id", "r, ac"),
                "current": ("(SELECT max(id) FROM agents_approval WHERE run_id = r.id)", "r"),
            }[e.approval]
            selects.append(f"SELECT %s, %s, r.id, {subject}, %s::timestamptz FROM {source}")
            params += [outbox.new_msg_id(), e.type, now]
        sql.append(
            ", o AS (INSERT INTO agents_outboxevent (msg_id, type, run_id, approval_id, created_at) "
            + " UNION ALL ".join(selects) + ")"
        )
    sql.append(" SELECT version FROM r")
    found = _fetch_prepared("".join(sql), params)
    return None if found is None else int(found[0])


# One prepared-statement cursor per database connection, reused for every transition.
_prepared_cursors: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _fetch_prepared(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """Run a statement bound and prepared on the server; its first row.

    Django binds parameters on the client, so PostgreSQL plans the transition statement
    afresh every time (planning cost 4x its execution). The statement text has a few
    shapes only (messages 1 or 2, with or without an intent...), so each shape is
    planned once per connection and reused. Only this statement is prepared: the rest of
    Django keeps client-side binding, and AIRLOCK_PREPARED_STATEMENTS=0 turns it off for
    a pooler that cannot keep prepared statements (docs/deployment.md).
    """
    if not settings.AIRLOCK_PREPARED_STATEMENTS:
        with connection.cursor() as plain:
            plain.execute(sql, params)
            return cast("tuple[Any, ...] | None", plain.fetchone())
    connection.ensure_connection()
    raw = connection.connection
    cursor = _prepared_cursors.get(raw)
    if cursor is None:
        cursor = _prepared_cursors[raw] = _prepared_cursor_class()(raw)
    # Django's wrapper keeps its error translation, execute wrappers and query log; it
    # is not closed, so the cursor lives as long as its connection.
    wrapped = connection._prepare_cursor(cursor)
    wrapped.execute(sql, params)
    return cast("tuple[Any, ...] | None", wrapped.fetchone())


@functools.cache
def _prepared_cursor_class() -> type:
    # Imported late: the module needs psycopg, which SQLite deployments may lack.
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):  # type: ignore[misc, valid-type]
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            return super().execute(query, params, **kwargs)

    return PreparedCursor


# -- the journal ---------------------------------------------------------------------


class StoreJournal:
    """The journal of one run, for one driver.

    It remembers what this driver itself wrote (intents, results) so the happy path
    reads nothing back; anything it did not write is read from the database. Only the
    lease holder drives a run, and a stale driver's commits are refused anyway.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self.known: dict[str, JournalEntry] = {}
        self.counts: dict[str, int] | None = None

    def starts_empty(self) -> None:
        """The run has not been picked up yet, so it has run no tool: nothing to count."""
        self.counts = {}

    def get(self, key: str) -> JournalEntry | None:
        if key in self.known:
            return self.known[key]
        row = ToolCall.objects.filter(idempotency_key=key).values("status", "result").first()
        return JournalEntry(row["status"], row["result"]) if row else None

    def executed(self, fingerprint: str) -> int:
        if self.counts is None:
            rows = (
                ToolCall.objects.filter(run=self.run, status__in=("succeeded", "failed"))
                .values_list("fingerprint")
                .annotate(n=Count("id"))
            )
            self.counts = dict(rows)
        return self.counts.get(fingerprint, 0)

    def begin(self, key: str) -> bool:
        # Committed on its own before the tool runs: after a crash, "started" without a
        # result means the call may have happened.
        with transaction.atomic():
            updated = ToolCall.objects.filter(idempotency_key=key, status="intended").update(
                status="started", attempts=F("attempts") + 1
            )
        # 0 rows: another worker marked it first and is running it; we leave it be.
        if updated == 1:
            self.known[key] = JournalEntry("started")
        return updated == 1

    def committed(self, t: Move) -> None:
        """Remember the journal effects of a transition this driver committed."""
        if t.intent is not None:
            self.known.setdefault(t.intent["key"], JournalEntry("intended"))
        if t.journal_reset is not None:
            self.known[t.journal_reset] = JournalEntry("intended")
        if t.journal_result is not None:
            r = t.journal_result
            self.known[r["key"]] = JournalEntry(r["status"], _result_fields(r)["result"])
            if self.counts is not None:
                self.counts[r["fp"]] = self.counts.get(r["fp"], 0) + 1


# A tool that answers within this keeps the driver's connection; a longer wait gives it
# back (checking a connection out of the pool again costs a round trip).
QUICK_TOOL_SECONDS = 0.005


class DjangoRunner(ThreadRunner):
    """Runs tools in a thread with its own database connection, closed afterwards;
    the driver's thread gives its own connection back once the tool makes it wait."""

    def wait(self, future: concurrent.futures.Future[Any], timeout: float) -> Any:
        started = time.monotonic()
        try:
            return future.result(timeout=min(QUICK_TOOL_SECONDS, timeout))
        except concurrent.futures.TimeoutError:
            if timeout <= QUICK_TOOL_SECONDS:
                raise
        release_connection()
        return future.result(timeout=max(0.0, timeout - (time.monotonic() - started)))

    def call(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            value = super().call(spec, args, ctx)
        finally:
            connection.close()
        faults.crash_point("after_tool_before_result_commit")
        return value


def clock_only(run: Run, now: float) -> Deps:
    """Deps for a run that waits for a human: it consults only the clock, so no model
    client or tool is built."""
    return Deps(model=cast(Any, None), registry=Registry(), journal=StoreJournal(run), now=lambda: now)


class ReleasingModel:
    """A model client that gives the thread's database connection back before each
    call: a call takes seconds, and a worker has many threads but a few connections.
    (`deps_for` skips the wrapper for a client that says `waits = False`: one that
    answers from memory, where the pool's round trip would be pure cost.)"""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner

    def decide(self, request: ModelRequest) -> Decision:
        release_connection()
        return self.inner.decide(request)


def deps_for(run: Run) -> Deps:
    from agents.llm import client_for
    from agents.tools import registry

    model = client_for(run.profile, run)
    return Deps(
        model=ReleasingModel(model) if getattr(model, "waits", True) else model,
        registry=registry(),
        journal=StoreJournal(run),
        runner=DjangoRunner(),
    )


# -- leases and the driver -----------------------------------------------------------


def _lease_free(owner: str, now: dt.datetime) -> Q:
    """Nobody holds the lease (or their lease expired), or `owner` holds it already."""
    return Q(lease_owner__isnull=True) | Q(lease_expires__lt=now) | Q(lease_owner=owner)


def claim(run_id: int, owner: str, seconds: float | None = None, *, version: int | None = None) -> bool:
    """Take the run's lease by conditional update; True if we hold it now. With
    `version`, only while the run is still at that version (what the caller read)."""
    now = timezone.now()
    seconds = settings.AIRLOCK_LEASE_SECONDS if seconds is None else seconds
    current = Run.objects.filter(pk=run_id, state__in=states.ACTIVE)
    if version is not None:
        current = current.filter(version=version)
    updated = (
        current.filter(_lease_free(owner, now))
        .update(
            lease_owner=owner,
            lease_expires=now + dt.timedelta(seconds=seconds),
            # Counted in the same update: a claim whose worker dies before it commits a
            # transition or releases cleanly stays counted (see `drive`).
            claims_without_progress=F("claims_without_progress") + 1,
        )
    )
    # 0 rows: another worker holds a live lease (it will finish the run) or the run rests.
    return updated == 1


def release(run_id: int, owner: str, *, clean: bool = True) -> None:
    """Give the lease back; a clean release also clears the count of dead claims.

    `clean=False` (the driver raised: a crash, a time limit) leaves the claim counted,
    so a run that keeps breaking its worker ends as poison instead of looping.
    """
    fields: dict[str, Any] = {"lease_owner": None, "lease_expires": None}
    if clean:
        fields["claims_without_progress"] = 0
    Run.objects.filter(pk=run_id, lease_owner=owner).update(**fields)


def lease_renew(pairs: set[tuple[int, str]]) -> int:
    """Extend the leases still held by these (run id, owner) pairs by a full lease, in
    one UPDATE (the worker's heartbeat); returns how many were renewed."""
    # Only leases we still hold: after a release (or a takeover) a pair matches nothing.
    held = Q()
    for run_id, owner in pairs:
        held |= Q(pk=run_id, lease_owner=owner)
    expires = timezone.now() + dt.timedelta(seconds=settings.AIRLOCK_LEASE_SECONDS)
    return Run.objects.filter(held).update(lease_expires=expires)


def _unattended(now: dt.datetime) -> Q:
    # A dead worker's lease (or an old wake-up stamp) has expired; a run never held
    # since its last release has been idle. A sent wake-up is stamped as an owner-less
    # `lease_expires` ("woken until"), which claim() ignores.
    idle_since = now - dt.timedelta(seconds=settings.AIRLOCK_IDLE_SECONDS)
    return Q(lease_expires__lt=now) | Q(lease_owner__isnull=True, lease_expires__isnull=True, updated_at__lt=idle_since)


def unattended_runs(now: dt.datetime, limit: int) -> list[int]:
    """Runs a worker should advance and nobody is advancing, the longest idle first."""
    return list(
        Run.objects.filter(state__in=ADVANCING)
        .filter(_unattended(now))
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )


def stamp_wakeup(run_id: int, now: dt.datetime) -> bool:
    """Stamp an unattended run as woken for an idle period; True if this caller won
    the stamp and so sends the wake-up."""
    stamped = (
        Run.objects.filter(pk=run_id, state__in=ADVANCING)
        .filter(_unattended(now))
        .update(lease_owner=None, lease_expires=now + dt.timedelta(seconds=settings.AIRLOCK_IDLE_SECONDS))
    )
    # 0 rows: another sweeper stamped it first (and sent the wake-up), or a worker took it.
    return stamped == 1


def step_once(run_id: int, owner: str, decide: Callable[[Run, RunState], Outcome | None]) -> Run | None:
    """Step a run nobody is driving once, for the sweeper; the run if this call
    committed a transition, None if it wrote nothing.

    1. Claim the lease (a worker or another sweeper holds it: leave it to them).
    2. Load the state and let `decide` compute the transition (None: nothing to do).
    3. Commit with the version check: whoever moved the run first (a reviewer, an
       operator) keeps their transition. Release the lease, cleanly unless we raised.
    """
    if not claim(run_id, owner, seconds=max(settings.AIRLOCK_LEASE_SECONDS, 30)):
        return None
    clean = False
    try:
        run = Run.objects.get(pk=run_id)
        state = load(run)
        outcome = decide(run, state)
        if outcome is None:
            clean = True
            return None
        after, t = outcome
        try:
            commit(run, state, after, t, actor=owner, lease_owner=owner)
        except StaleRun:
            clean = True
            return None
        clean = True
        return run
    finally:
        release(run_id, owner, clean=clean)


def poison_reason(claims: int) -> str | None:
    """Why a run is given up after its claims kept dying, or None while it may go on."""
    limit = settings.AIRLOCK_MAX_DEAD_CLAIMS
    dead = claims - 1  # the claim just taken is alive
    if dead < limit:
        return None
    return (
        f"poison run: {dead} worker claims in a row ended without progress "
        f"(the worker died or the step crashed each time; AIRLOCK_MAX_DEAD_CLAIMS {limit})"
    )


def _claimed(run: Run, owner: str) -> Run | None:
    """`run` under our lease, read again only if it moved since the caller read it;
    None when someone else holds the lease or the run rests."""
    if claim(run.pk, owner, version=run.version):
        run.lease_owner = owner
        run.claims_without_progress += 1
        return run
    if claim(run.pk, owner):  # it moved between the read and the claim
        return read_run(run.pk)
    return None


def drive(
    run_id: int,
    *,
    max_transitions: int = 10_000,
    max_seconds: float | None = None,
    owner: str | None = None,
    deps: Deps | Callable[[Run], Deps] | None = None,
    run: Run | None = None,
) -> Run:
    """Step and persist until the run rests.

    1. Read the run and claim the lease (a live lease held by someone else: return at
       once). A queued run is claimed by its first commit, the pickup, instead.
    2. Load the state once; then per step call the model or tool outside any
       transaction and commit the transition with the version check.
    3. Stop at a terminal state, a wait for a human, a stale version, the budget of
       transitions or of seconds; release the lease (cleanly unless we raised).

    A run whose previous claims all died without progress is failed instead of stepped.
    `deps` are the model, tools and journal to step with, or a function making them
    from the run (by default `deps_for`). `run` is the run as the caller just read it
    (with its profile), which saves reading it again; a run that moved since is read
    again after the claim.
    """
    owner = owner or worker_name()
    if run is None:
        run = read_run(run_id)
        if run is None:
            raise Run.DoesNotExist(f"no run {run_id}")
    # A queued run's first step is the pickup, which calls nothing: its commit takes
    # the lease (one commit, not two). A claim that died before it is counted the
    # usual way, so the poison count still sees it.
    claiming = run.state == states.QUEUED and run.claims_without_progress == 0
    if not claiming:
        claimed = _claimed(run, owner)
        if claimed is None:
            return Run.objects.get(pk=run_id)
        run = claimed
    clean_exit = ended = False
    started = time.monotonic()
    unbind = bind_run(run.pk, run.trace_context)  # log lines name the run and its trace
    try:
        state = load(run)
        reason = poison_reason(run.claims_without_progress)
        if reason is not None:
            _fail_poison(run, state, reason, owner)
        else:
            deps = deps(run) if callable(deps) else deps or deps_for(run)
            if state.state == states.QUEUED and isinstance(deps.journal, StoreJournal):
                deps.journal.starts_empty()
            for _ in range(max_transitions):
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                outcome = step(state, deps)
                if outcome is None:
                    break
                after, t = outcome
                try:
                    commit(run, state, after, t, actor=owner, lease_owner=owner, claim=claiming)
                    if isinstance(deps.journal, StoreJournal):
                        deps.journal.committed(t)
                except StaleRun:
                    log.info("stale run=%s version=%s: another actor moved it; dropping our step", run.pk, run.version)
                    break
                claiming = False
                state = after
                # The terminal commit released the lease and left `run` current.
                ended = after.state in states.TERMINAL
        clean_exit = True
    finally:
        if not ended and not claiming:
            release(run_id, owner, clean=clean_exit)
        # The tool thread ends with the drive (a worker drives thousands of runs).
        close = getattr(deps.runner, "close", None) if deps is not None else None
        if close is not None:
            close()
        unbind()
    if not ended:
        run.refresh_from_db()
    return run


def _fail_poison(run: Run, state: RunState, reason: str, owner: str) -> None:
    after, t = fail(state, reason)
    try:
        commit(run, state, after, t, actor=owner, lease_owner=owner)
    except StaleRun:
        return  # someone else moved it first (a cancel): their transition stands
    log.warning("gave up run=%s: %s", run.pk, reason)
