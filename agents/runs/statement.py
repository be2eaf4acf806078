"""A transition's commit as one PostgreSQL statement of data-modifying CTEs, sent
through a prepared-statement cursor kept per connection (the store's fast path; the ORM
path in store.py writes the same rows on SQLite)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import weakref
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import connection

from agents.engine.step import Move
from agents.models import Approval, Run
from agents.notifications import events as outbox
from agents.runs.sanitize import bounded_result, clean

if TYPE_CHECKING:
    from agents.runs.store import Events


def intent_fields(i: dict[str, Any]) -> dict[str, Any]:
    return {
        "idempotency_key": i["key"], "fingerprint": i["fp"], "step": i["step"], "call_id": i["call_id"][:200],
        "tool": i["tool"][:100], "args": clean(i["args"]),
    }


def result_fields(r: dict[str, Any]) -> dict[str, Any]:
    result, chars, truncated = bounded_result(r["result"])
    return {"status": r["status"], "result": result, "result_chars": chars, "result_truncated": truncated}


def approval_fields(a: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    return {
        "kind": a["kind"], "idempotency_key": a["key"], "call_id": a["call_id"][:200], "step": a["step"],
        "tool": a["tool"][:100], "args": clean(a["args"]), "risk": a["risk"], "reason": clean(a["reason"]),
        "taint_source": clean(a["taint_source"]), "rule": clean(a.get("rule")), "required": a.get("required", 1),
        "status": a["status"], "decided_at": now if a["status"] != Approval.Status.PENDING else None,
        "expires_at": moment(a.get("expires_at")), "shadow": clean(a.get("shadow") or []),
    }


def moment(epoch: float | None) -> dt.datetime | None:
    return None if epoch is None else dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


def commit_statement(
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
        f = intent_fields(t.intent)
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
        f = result_fields(t.journal_result)
        sql.append(
            ", jx AS (UPDATE agents_toolcall SET status = %s, result = %s::jsonb, result_chars = %s,"
            " result_truncated = %s, finished_at = %s WHERE idempotency_key = %s AND EXISTS (SELECT 1 FROM r))"
        )
        params += [f["status"], j(f["result"]), f["result_chars"], f["result_truncated"], now, t.journal_result["key"]]
    if t.approval is not None:
        f = approval_fields(t.approval, now)
        sql.append(
            ", a AS (INSERT INTO agents_approval (run_id, kind, idempotency_key, call_id, step, tool, args, risk, reason,"
            " taint_source, rule, required, status, decision, decided_at, note, expires_at, round, created_at, shadow)"
            " SELECT r.id, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, %s::jsonb, %s, %s, '', %s, '', %s, 0, %s,"
            " %s::jsonb"
            " FROM r RETURNING id)"
        )
        params += [f["kind"], f["idempotency_key"], f["call_id"], f["step"], f["tool"], j(f["args"]), f["risk"],
                   f["reason"], None if f["taint_source"] is None else j(f["taint_source"]),
                   None if f["rule"] is None else j(f["rule"]), f["required"], f["status"], f["decided_at"],
                   f["expires_at"], now, j(f["shadow"])]
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

    class PreparedCursor(ServerBindingCursor):  # type: ignore[misc]
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            return super().execute(query, params, **kwargs)

    return PreparedCursor
