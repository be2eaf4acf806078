"""The only code that turns engine results into rows, and rows back into engine state.

Every transition is one database transaction, committed only if the run's `version` is
still the one the engine read (optimistic concurrency).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from agents import faults
from agents.engine import patch, states
from agents.engine.step import Move, RunState
from agents.models import Approval, ApprovalClaim, Grant, Message, OutboxEvent, Run, ToolCall, Transition
from agents.notifications import events as outbox
from agents.ops import telemetry
from agents.runs import rows, statement
from agents.runs.sanitize import clean, clean_json

log = logging.getLogger("airlock.store")

Events = tuple[outbox.Event, ...]
# States a worker advances; awaiting_approval waits for a reviewer (or the deadline).
ADVANCING = (states.QUEUED, states.PLANNING, states.ACTING)


def waits_for_client(run: Run) -> bool:
    """An external agent's run resting while its client thinks (planning) or runs one
    of its client tools (acting): only the client's next request moves it, so no worker
    advances it (the sweeper still fails it at its deadline)."""
    if run.profile.provider != "external":
        return False
    return run.state == states.PLANNING or (
        run.state == states.ACTING and bool(((run.engine or {}).get("current_call") or {}).get("client"))
    )


def waits_for_client_q() -> Q:
    """`waits_for_client` as a filter, for the sweeper's search for idle runs."""
    external = Q(profile__provider="external")
    return external & (Q(state=states.PLANNING) | Q(state=states.ACTING, engine__current_call__client=True))


class StaleRun(Exception):
    """Someone else committed a transition of this run first."""


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
    return int(run.pk)


def create(run: Run, state: RunState, *, actor: str, kind: str = "launch", detail: dict[str, Any] | None = None) -> Run:
    """Insert a new run (its id from `reserve_id`) with its launch transition (seq 1)
    and first messages. A fork's first transition is kind "fork", its `detail` the fork
    point, its messages the transcript copied from the parent (agents/forks.py)."""
    with transaction.atomic():
        for name, value in cache_fields(state).items():
            setattr(run, name, value)
        run.version = 1
        run.deadline = dt.datetime.fromtimestamp(state.deadline, tz=dt.UTC)
        # An id set by hand would make save() try an UPDATE first: say it is new.
        run.save(force_insert=run._state.adding)
        Transition.objects.create(
            run=run, seq=1, from_state="", to_state=state.state, kind=kind,
            payload={"patch": run.engine, **clean(detail or {})}, actor=actor,
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
        seq = statement.commit_statement(run, cached, engine_text, row, messages, t, now, events, claimant)
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
            current = current.filter(lease_free(claimant, now))
        updated = current.update(version=F("version") + 1, **cached)
        if updated != 1:
            return None
        seq = int(run.version) + 1
        Transition.objects.create(run=run, seq=seq, **row)
        Message.objects.bulk_create([Message(run=run, seq=seq, **m) for m in messages])
        _apply_effects(run, t, now, events, user)
    return seq


def _apply_effects(run: Run, t: Move, now: dt.datetime, events: Events, user: Any = None) -> None:
    if t.intent is not None:
        i = t.intent
        # A retried approval can meet an intent that already exists: keep the first.
        ToolCall.objects.bulk_create([ToolCall(run=run, **statement.intent_fields(i))], ignore_conflicts=True)
    if t.journal_reset is not None:
        ToolCall.objects.filter(idempotency_key=t.journal_reset).update(status="intended", result=None)
    if t.journal_result is not None:
        ToolCall.objects.filter(idempotency_key=t.journal_result["key"]).update(
            **statement.result_fields(t.journal_result), finished_at=now
        )
    created = closed = None
    if t.approval is not None:
        created = Approval.objects.create(run=run, **statement.approval_fields(t.approval, now, profile_id=run.profile_id)).pk
    if t.approval_close is not None:
        pending = Approval.objects.pending().filter(run=run)
        if events:
            # Locked, so the update below closes exactly these (a decision racing us waits).
            closed = list(pending.select_for_update().values_list("pk", flat=True))
            pending = Approval.objects.filter(pk__in=closed)
        closing = list(pending.values_list("pk", flat=True)) if closed is None else closed
        pending.update(status=t.approval_close, decided_at=now, claimed_by=None, claimed_until=None)
        # The call left the queue: its open claim ends (statement.py does the same).
        ApprovalClaim.objects.filter(approval_id__in=closing).close("left", now)
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


def lease_free(owner: str, now: dt.datetime) -> Q:
    """Nobody holds the lease (or their lease expired), or `owner` holds it already."""
    return Q(lease_owner__isnull=True) | Q(lease_expires__lt=now) | Q(lease_owner=owner)
