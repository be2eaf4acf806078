"""A transition's commit as one PostgreSQL statement of data-modifying CTEs, sent
through a prepared-statement cursor kept per connection (the store's fast path; the ORM
path in store.py writes the same rows on SQLite)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.db import connection

from agents.engine.run import ApprovalRow, IntentRow, JournalResult, Move
from agents.lib import prepared
from agents.lib.sanitize import bounded_result, clean
from agents.models import Approval, ClientCall, Run
from agents.models.approvals import call_group_key
from agents.notifications import events as outbox

if TYPE_CHECKING:
    from agents.runs.store import Events


def intent_fields(i: IntentRow) -> dict[str, Any]:
    return {
        "idempotency_key": i["key"], "fingerprint": i["fp"], "step": i["step"], "call_id": i["call_id"][:200],
        "tool": i["tool"][:100], "args": clean(i["args"]),
    }


def result_fields(r: JournalResult) -> dict[str, Any]:
    result, chars, truncated = bounded_result(r["result"])
    return {"status": r["status"], "result": result, "result_chars": chars, "result_truncated": truncated}


def approval_fields(a: ApprovalRow, now: dt.datetime, *, profile_id: int) -> dict[str, Any]:
    args, rule, tool = clean(a["args"]), clean(a.get("rule")), a["tool"][:100]
    return {
        "kind": a["kind"], "idempotency_key": a["key"], "call_id": a["call_id"][:200], "step": a["step"],
        "tool": tool, "args": args, "risk": a["risk"], "reason": clean(a["reason"]),
        "taint_source": clean(a["taint_source"]), "rule": rule, "required": a.get("required", 1),
        "status": a["status"], "decided_at": now if a["status"] != Approval.Status.PENDING else None,
        "expires_at": moment(a.get("expires_at")), "shadow": clean(a.get("shadow") or []),
        "history": clean(a.get("history")), "prior": a.get("prior"),
        "group_key": call_group_key(profile_id=profile_id, kind=a["kind"], tool=tool, rule=rule, args=args),
    }


def moment(epoch: float | None) -> dt.datetime | None:
    return None if epoch is None else dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


# The keys of the calls whose delivery a result's commit in this context marked
# (`delivering`); None outside one.
_delivering: ContextVar[set[str] | None] = ContextVar("airlock_delivering", default=None)


@contextmanager
def delivering() -> Iterator[set[str]]:
    """Within it, a commit that writes a call's result also marks the external
    agent's call of that key delivered (`ClientCall.delivered_at`, what
    `agents.actions.external.call_delivered` sets), in the same statement: one durable commit
    fewer for a caller that answers with that result at once (the gateway's allowed
    call of a retry-safe tool, agents/gateway/core.py). Yields the keys so marked; a
    call not among them (the ORM path, SQLite, a result committed by someone else) is
    marked the usual way, after."""
    marked: set[str] = set()
    token = _delivering.set(marked)
    try:
        yield marked
    finally:
        _delivering.reset(token)


class Params(dict[str, Any]):
    """Named placeholders: `p("seq", value)` writes `%(seq)s` where the value goes and
    keeps the value under that name, so a column and its value sit side by side and
    cannot drift apart as positional `%s` lists could."""

    def __call__(self, name: str, value: Any, cast_to: str = "") -> str:
        self[name] = value
        return f"%({name})s{cast_to}"


def commit_statement(
    run: Run, cached: dict[str, Any], engine_text: str, row: dict[str, Any], messages: list[dict[str, Any]], t: Move,
    now: dt.datetime, events: Events, lease_taker: str | None, record: ClientCall | None = None, *,
    keep_policy: bool = False,
) -> int | None:
    """The transition as one PostgreSQL statement of data-modifying CTEs.

    Every insert selects FROM the version-checked run update, so when another actor
    moved the run first the update matches nothing and nothing else is written.
    `record` (an external agent's proposal) is inserted too, and gets its id and
    `created_at` from this statement. `keep_policy`: `engine_text` is the state
    without its policy, which the run's row keeps as it is.
    """
    j = json.dumps
    p = Params()
    # The stored policy, read from the row being updated (its old value).
    kept = """ || jsonb_build_object('policy', "engine" -> 'policy')""" if keep_policy else ""
    sets = ", ".join(
        f'"{k}" = ' + (p("engine", engine_text, "::jsonb") + kept if k == "engine" else p(f"run_{k}", v))
        for k, v in cached.items()
    )
    leasing = (
        f' AND ("lease_owner" IS NULL OR "lease_expires" < {p("lease_now", now)} OR "lease_owner" = {p("lease_taker", lease_taker)})'
        if lease_taker
        else ""
    )
    sql = [
        f'WITH r AS (UPDATE agents_run SET "version" = "version" + 1, {sets}'
        f' WHERE "id" = {p("run_id", run.pk)} AND "version" = {p("version", run.version)}{leasing} RETURNING "id", "version")'
    ]
    sql.append(
        ", t AS (INSERT INTO agents_transition (run_id, seq, from_state, to_state, kind, payload, cost_micros, tokens,"
        f" duration_ms, actor, created_at) SELECT r.id, r.version, {p('from_state', row['from_state'])},"
        f" {p('to_state', row['to_state'])}, {p('kind', row['kind'])}, {p('payload', j(row['payload']), '::jsonb')},"
        f" {p('cost_micros', row['cost_micros'])}, {p('tokens', row['tokens'])}, {p('duration_ms', row['duration_ms'])},"
        f" {p('actor', row['actor'])}, {p('now', now)} FROM r)"
    )
    if messages:
        values = ", ".join(
            f"({p(f'm{n}_index', m['index'], '::int')}, {p(f'm{n}_role', m['role'])}, {p(f'm{n}_content', m['content'])},"
            f" {p(f'm{n}_tool_calls', None if m['tool_calls'] is None else j(m['tool_calls']), '::jsonb')},"
            f" {p(f'm{n}_tool_call_id', m['tool_call_id'])}, {p(f'm{n}_name', m['name'])})"
            for n, m in enumerate(messages)
        )
        sql.append(
            ', m AS (INSERT INTO agents_message (run_id, "index", seq, role, content, tool_calls, tool_call_id, name,'
            f" created_at) SELECT r.id, v.i, r.version, v.role, v.content, v.tc, v.tcid, v.name, %(now)s FROM r, (VALUES {values})"
            " AS v(i, role, content, tc, tcid, name))"
        )
    if t.intent is not None:
        f = intent_fields(t.intent)
        sql.append(
            ", i AS (INSERT INTO agents_toolcall (run_id, idempotency_key, fingerprint, step, call_id, tool, args, status,"
            f" result_chars, result_truncated, attempts, created_at) SELECT r.id, {p('i_key', f['idempotency_key'])},"
            f" {p('i_fp', f['fingerprint'])}, {p('i_step', f['step'])}, {p('i_call_id', f['call_id'])}, {p('i_tool', f['tool'])},"
            f" {p('i_args', j(f['args']), '::jsonb')}, 'intended', 0, false, 0, %(now)s FROM r"
            " ON CONFLICT (idempotency_key) DO NOTHING)"
        )
    if t.journal_reset is not None:
        sql.append(
            ", jr AS (UPDATE agents_toolcall SET status = 'intended', result = NULL"
            f" WHERE idempotency_key = {p('jr_key', t.journal_reset)} AND EXISTS (SELECT 1 FROM r))"
        )
    if t.journal_result is not None:
        f = result_fields(t.journal_result)
        sql.append(
            f", jx AS (UPDATE agents_toolcall SET status = {p('jx_status', f['status'])},"
            f" result = {p('jx_result', j(f['result']), '::jsonb')}, result_chars = {p('jx_chars', f['result_chars'])},"
            f" result_truncated = {p('jx_truncated', f['result_truncated'])}, finished_at = %(now)s"
            f" WHERE idempotency_key = {p('jx_key', t.journal_result['key'])} AND EXISTS (SELECT 1 FROM r))"
        )
    marking = _delivering.get() if t.journal_result is not None else None
    if marking is not None:
        sql.append(
            ", dl AS (UPDATE agents_clientcall c SET delivered_at = %(now)s FROM r"
            " WHERE c.run_id = r.id AND c.key = %(jx_key)s AND c.delivered_at IS NULL RETURNING c.id)"
        )
    if t.approval is not None:
        f = approval_fields(t.approval, now, profile_id=run.profile_id)
        taint, rule, prior = f["taint_source"], f["rule"], f["prior"]
        sql.append(
            ", a AS (INSERT INTO agents_approval (run_id, kind, idempotency_key, call_id, step, tool, args, risk, reason,"
            " taint_source, rule, required, status, decision, decided_at, note, expires_at, round, created_at, shadow,"
            " prior, group_key, history)"
            f" SELECT r.id, {p('a_kind', f['kind'])}, {p('a_key', f['idempotency_key'])}, {p('a_call_id', f['call_id'])},"
            f" {p('a_step', f['step'])}, {p('a_tool', f['tool'])}, {p('a_args', j(f['args']), '::jsonb')},"
            f" {p('a_risk', f['risk'])}, {p('a_reason', f['reason'])},"
            f" {p('a_taint', None if taint is None else j(taint), '::jsonb')}, {p('a_rule', None if rule is None else j(rule), '::jsonb')},"
            f" {p('a_required', f['required'])}, {p('a_status', f['status'])}, '', {p('a_decided_at', f['decided_at'])}, '',"
            f" {p('a_expires_at', f['expires_at'])}, 0, %(now)s, {p('a_shadow', j(f['shadow']), '::jsonb')},"
            f" {p('a_prior', None if prior is None else j(prior), '::jsonb')}, {p('a_group_key', f['group_key'])},"
            f" {p('a_history', None if f['history'] is None else j(f['history']), '::jsonb')}"
            " FROM r RETURNING id)"
        )
    if t.approval_close is not None:
        sql.append(
            f", ac AS (UPDATE agents_approval SET status = {p('ac_status', t.approval_close)}, decided_at = %(now)s,"
            " claimed_by_id = NULL, claimed_until = NULL"
            " WHERE run_id = %(run_id)s AND status = 'pending' AND EXISTS (SELECT 1 FROM r) RETURNING id)"
        )
        # The call left the queue: its open claim ends (ApprovalClaimQuerySet.close's rule).
        sql.append(
            ', acl AS (UPDATE agents_approvalclaim SET ended_at = LEAST("until", %(now)s),'
            """ "end" = CASE WHEN "until" <= %(now)s THEN 'lapsed' ELSE 'left' END"""
            " WHERE ended_at IS NULL AND approval_id IN (SELECT id FROM ac))"
        )
    if events:
        # One insert, its rows in the events' order. The approval an event is about
        # comes from the CTE that wrote it (or, for a decision, the run's newest
        # approval); no such row, no event.
        selects = []
        for n, e in enumerate(events):
            subject, source = {
                None: ("NULL", "r"),
                "created": ("a.id", "r, a"),
                "closed": ("ac.id", "r, ac"),
                "current": ("(SELECT max(id) FROM agents_approval WHERE run_id = r.id)", "r"),
            }[e.approval]
            selects.append(
                f"SELECT {p(f'e{n}_msg_id', outbox.new_msg_id())}, {p(f'e{n}_type', e.type)}, r.id, {subject},"
                f" %(now)s::timestamptz FROM {source}"
            )
        sql.append(
            ", o AS (INSERT INTO agents_outboxevent (msg_id, type, run_id, approval_id, created_at) "
            + " UNION ALL ".join(selects) + ")"
        )
    if record is not None:
        sql.append(
            ", cc AS (INSERT INTO agents_clientcall (run_id, key, call_id, fingerprint, tool, args, client, verdict, reason,"
            f" rule, created_at) SELECT r.id, {p('cc_key', record.key)}, {p('cc_call_id', record.call_id)},"
            f" {p('cc_fp', record.fingerprint)}, {p('cc_tool', record.tool)}, {p('cc_args', j(record.args), '::jsonb')},"
            f" {p('cc_client', record.client)}, {p('cc_verdict', record.verdict)}, {p('cc_reason', record.reason)},"
            f" {p('cc_rule', None if record.rule is None else j(record.rule), '::jsonb')}, %(now)s FROM r RETURNING id)"
        )
    sql.append(" SELECT version, " + ("(SELECT id FROM cc)" if record is not None else "NULL")
               + (", (SELECT count(*) FROM dl)" if marking is not None else ", 0") + " FROM r")
    # Prepared on the server (agents/lib/prepared.py): the text has a few shapes only
    # (messages 1 or 2, with or without an intent...), each planned once per connection;
    # planning it afresh cost 4x its execution.
    found = prepared.fetchone("".join(sql), p)
    if found is None:
        return None
    if record is not None:
        record.pk, record.created_at = found[1], now
        record._state.adding, record._state.db = False, connection.alias
    if marking is not None and found[2]:
        marking.add(str(p["jx_key"]))
    return int(found[0])
