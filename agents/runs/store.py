"""The only code that turns engine results into rows, and rows back into engine state.

Every transition is one database transaction, committed only if the run's `version` is
still the one the engine read (optimistic concurrency).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from agents.engine import patch, states
from agents.engine.run import Move, RunState
from agents.lib import faults, rows
from agents.lib.sanitize import clean, clean_json
from agents.models import (
    Approval,
    ApprovalClaim,
    ClientCall,
    Grant,
    Message,
    OutboxEvent,
    Run,
    ToolCall,
    Transition,
)
from agents.models.runs import engine_message
from agents.notifications import events as outbox
from agents.ops import telemetry
from agents.runs import history, statement

log = logging.getLogger("airlock.store")

Events = tuple[outbox.Event, ...]
# States a worker advances; awaiting_approval waits for a reviewer (or the deadline).
ADVANCING = (states.QUEUED, states.PLANNING, states.ACTING)


def waits_for_client(run: Run) -> bool:
    """An external agent's run resting while its client thinks (planning) or runs one
    of its client tools (acting): only the client's next request moves it, so no worker
    advances it (the sweeper still fails it at its deadline)."""
    return _rests(run, run.state, (run.engine or {}).get("current_call"))


def rests_for_client(run: Run, state: RunState) -> bool:
    """`waits_for_client` of the run once in `state`."""
    return _rests(run, state.state, state.current_call)


def _rests(run: Run, state: str, current_call: dict[str, Any] | None) -> bool:
    if run.profile.provider != "external":
        return False
    return state == states.PLANNING or (state == states.ACTING and bool((current_call or {}).get("client")))


def waits_for_client_q() -> Q:
    """`waits_for_client` as a filter, for the sweeper's search for idle runs."""
    external = Q(profile__provider="external")
    return external & (Q(state=states.PLANNING) | Q(state=states.ACTING, engine__current_call__client=True))


class StaleRun(Exception):
    """Someone else committed a transition of this run first."""


class Transcripts:
    """The transcripts of live runs as this process last committed or read them, each
    under the run's version it belongs to.

    An external agent's run is loaded on every proposal and every report, and each time
    its transcript is the one this process's own last commit of the run wrote; read
    from the database it costs more than the rest of the request, and more as the run
    grows. An entry answers only for its own version and message count: every
    transition bumps the version and only transitions append messages, so a commit
    made anywhere else (another web process, a worker, a reviewer) makes it miss, and
    the database answers. Finished runs are never kept (a purge then deletes their
    messages), entries unused for AIRLOCK_TRANSCRIPT_CACHE_SECONDS go, and at most
    AIRLOCK_TRANSCRIPT_CACHE messages are held in all (0 turns the cache off). The
    engine never changes a message in place (a step appends new ones), so the cached
    dicts are shared; the lists are never changed either (`RunState.from_json` copies
    the one it is given, and the callers of `put` hand over lists of their own).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # run id -> (version, the run's created_at, messages, last used)
        self._entries: OrderedDict[int, tuple[int, Any, list[dict[str, Any]], float]] = OrderedDict()
        self._held = 0

    def get(self, run: Run) -> list[dict[str, Any]] | None:
        with self._lock:
            entry = self._entries.get(run.pk)
            if entry is None:
                return None
            version, created, messages, _used = entry
            # created_at too: an id used again (a database restored or flushed) is another run.
            if version != run.version or created != _created(run) or len(messages) != run.messages_count:
                return None
            self._entries[run.pk] = (version, created, messages, time.monotonic())
            self._entries.move_to_end(run.pk)
            return messages

    def put(self, run: Run, messages: list[dict[str, Any]]) -> None:
        """Keep `messages` as the transcript of `run` at its version once the caller's
        transaction commits (none: now); a rollback keeps nothing, since the version
        would then be written again, maybe with other messages. A run that has
        finished, or whose message count is not this list's, is dropped instead."""
        run_id, version, created = int(run.pk), int(run.version), _created(run)
        keep = created is not None and run.state not in states.TERMINAL and len(messages) == run.messages_count
        self.forget(run_id)
        if keep:
            transaction.on_commit(lambda: self._put(run_id, version, created, messages))

    def _put(self, run_id: int, version: int, created: Any, messages: list[dict[str, Any]]) -> None:
        limit = settings.AIRLOCK_TRANSCRIPT_CACHE
        with self._lock:
            self._drop(run_id)
            if 0 < len(messages) <= limit:
                self._entries[run_id] = (version, created, messages, time.monotonic())
                self._held += len(messages)
            self._trim(limit)

    def forget(self, run_id: int) -> None:
        with self._lock:
            self._drop(run_id)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    def _drop(self, run_id: int) -> None:
        entry = self._entries.pop(run_id, None)
        if entry is not None:
            self._held -= len(entry[2])

    def _trim(self, limit: int) -> None:
        # Least recently used first: over the bound, or unused for too long.
        stale = time.monotonic() - settings.AIRLOCK_TRANSCRIPT_CACHE_SECONDS
        while self._entries:
            run_id, (_v, _c, _m, used) = next(iter(self._entries.items()))
            if self._held <= limit and used >= stale:
                break
            self._drop(run_id)


def _created(run: Run) -> Any:
    # Not `run.created_at`: on a run read with only() that would be a query.
    return run.__dict__.get("created_at")


transcripts = Transcripts()


def load(run: Run) -> RunState:
    messages = transcripts.get(run)
    if messages is None:
        messages = Message.engine_transcript(run)
        transcripts.put(run, messages)
    return RunState.from_json(run.engine, messages)


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
    point, its messages the transcript copied from the parent (agents/actions/forks.py)."""
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
        rows_ = _message_rows(0, state.messages)
        Message.objects.bulk_create([Message(run=run, seq=1, **m) for m in rows_])
    transcripts.put(run, [_as_read(m) for m in rows_])
    return run


def _as_read(row: dict[str, Any]) -> dict[str, Any]:
    """A written message row as `Message.engine_transcript` reads it back."""
    return engine_message(row["role"], row["content"], row["tool_calls"], row["tool_call_id"], row["name"])


def commit(
    run: Run,
    before: RunState,
    after: RunState,
    t: Move,
    *,
    actor: str,
    lease_owner: str | None = None,
    take_lease: bool = False,
    user: Any = None,
    record: ClientCall | None = None,
    recheck_history: bool = False,
) -> None:
    """Write one transition and its effects atomically, or raise StaleRun.

    A worker passes its `lease_owner`: the same update renews its lease, so a long run
    costs no extra commit to keep it. With `take_lease` the update also takes the lease, on
    driver.take_lease()'s terms (free, expired or ours), and raises StaleRun if someone else
    holds it: a worker picking up a queued run needs no lease commit of its own. On
    PostgreSQL the whole transition is one statement (one round trip); elsewhere it is
    one ORM transaction. Both write the same rows. `user` is the person behind a grant
    or a revocation. `record`, an external agent's proposal (an unsaved ClientCall of
    this run), is written by the same commit and saved on return.

    `recheck_history`: the verdict was judged with history figures read outside any
    transaction (a worker's step): the commit locks what they count and raises
    HistoryMoved, writing nothing, if they changed meanwhile (agents/runs/history.py).
    """
    if recheck_history and t.history:
        with transaction.atomic():
            history.hold(run, t.history)
            commit(run, before, after, t, actor=actor, lease_owner=lease_owner, take_lease=take_lease, user=user, record=record)
        return
    now = timezone.now()
    # Grants are rare, human-paced transitions: they take the ORM path.
    one_statement = (
        t.grant is None and t.grant_revoke is None and connection.vendor == "postgresql"
        and settings.AIRLOCK_STORE_ONE_STATEMENT
    )
    # The policy is fixed at launch and a step never replaces it (RunState.copy shares
    # it), so the one statement keeps the stored one (`keep_policy`) instead of being
    # sent it again with every transition: under a few rules it is most of the state
    # (0.12 ms a proposal under five rules that never matched, in turns with none).
    # `run.engine` is the stored state of `before`, as the version check makes sure.
    stored_policy = (run.engine or {}).get("policy")
    keep_policy = one_statement and stored_policy is not None and after.policy is stored_policy
    if keep_policy:
        rest, engine_text = clean_json(after.engine_json(policy=False))
        engine = {**rest, "policy": stored_policy}
    else:
        engine, engine_text = clean_json(after.engine_json())
    cached = cache_fields(after, engine)
    if lease_owner is not None:
        # A run that ends, or rests until its client's next request, gives its lease
        # back in the same update: no release commit.
        ends = after.state in states.TERMINAL or rests_for_client(run, after)
        cached["lease_owner"] = None if ends else lease_owner
        cached["lease_expires"] = None if ends else now + dt.timedelta(seconds=settings.AIRLOCK_LEASE_SECONDS)
    cached["updated_at"] = now
    cached["finished_at"] = now if after.state in states.TERMINAL else None
    # Progress: the poison count (leases that died without a transition) starts over.
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
    lease_taker = lease_owner if take_lease else None
    if one_statement:
        seq = statement.commit_statement(
            run, cached, engine_text, row, messages, t, now, events, lease_taker, record, keep_policy=keep_policy
        )
    else:
        seq = _commit_orm(run, cached, row, messages, t, now, events, lease_taker, user, record)
    if seq is None:
        # Another worker (or a reviewer, or the sweeper) committed first, or holds the
        # lease we meant to take; their transition stands and nothing of ours was written.
        raise StaleRun(f"run {run.pk} moved past version {run.version} or is driven by another worker")
    if events:
        # Right away when we are not inside an outer transaction (a worker), else when
        # the caller's (a decision's) commits.
        outbox.wake_after_commit()
    for name, value in cached.items():
        setattr(run, name, value)
    run.version = seq
    # `before` is the state of record at the version we moved past (the version check
    # made sure), so its transcript plus the rows just written is the new one.
    transcripts.put(run, [*before.messages, *map(_as_read, messages)])
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
    lease_taker: str | None,
    user: Any = None,
    record: ClientCall | None = None,
) -> int | None:
    with transaction.atomic():
        current = Run.objects.filter(pk=run.pk, version=run.version)
        if lease_taker is not None:
            current = current.filter(lease_free(lease_taker, now))
        updated = current.update(version=F("version") + 1, **cached)
        if updated != 1:
            return None
        seq = int(run.version) + 1
        Transition.objects.create(run=run, seq=seq, **row)
        Message.objects.bulk_create([Message(run=run, seq=seq, **m) for m in messages])
        _apply_effects(run, t, now, events, user)
        if record is not None:
            record.save(force_insert=True)
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
