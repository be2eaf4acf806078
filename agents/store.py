"""The only code that turns engine results into rows, and rows back into engine state.

Every transition is one database transaction, committed only if the run's `version` is
still the one the engine read (optimistic concurrency).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from agents import faults
from agents.engine import states
from agents.engine.protocols import Deps, JournalEntry, ThreadRunner
from agents.engine.registry import ToolContext, ToolSpec
from agents.engine.step import RunState, Transition, step
from agents.models import Approval, Message, Run, ToolCall
from agents.models import Transition as TransitionRow

log = logging.getLogger("airlock.store")


class StaleRun(Exception):
    """Someone else committed a transition of this run first."""


def worker_name() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


# -- text PostgreSQL can store -------------------------------------------------------


def clean(value: Any) -> Any:
    """NUL bytes and lone surrogates (invalid UTF-8) replaced, recursively."""
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
    messages = [m.to_engine() for m in Message.objects.filter(run=run).order_by("index")]
    return RunState.from_json(run.engine, messages)


def cache_fields(state: RunState) -> dict[str, Any]:
    return {
        "state": state.state,
        "steps": state.steps,
        "cost_micros": state.cost_micros,
        "cost_unknown": state.cost_unknown,
        "tokens": state.tokens,
        "tainted": state.tainted,
        "answer": clean(state.answer),
        "error": clean(state.error),
        "engine": clean(state.engine_json()),
        "messages_count": len(state.messages),
    }


def _message_rows(run: Run, seq: int, start: int, messages: list[dict[str, Any]]) -> list[Message]:
    return [
        Message(
            run=run,
            index=start + i,
            seq=seq,
            role=m["role"],
            content=clean(m.get("content") or ""),
            tool_calls=clean(m.get("tool_calls")),
            tool_call_id=m.get("tool_call_id", ""),
            name=m.get("name", ""),
        )
        for i, m in enumerate(messages)
    ]


def create(run: Run, state: RunState, *, actor: str) -> Run:
    """Insert a new run with its launch transition (seq 1) and first messages."""
    with transaction.atomic():
        for name, value in cache_fields(state).items():
            setattr(run, name, value)
        run.version = 1
        run.deadline = dt.datetime.fromtimestamp(state.deadline, tz=dt.UTC)
        run.save()
        TransitionRow.objects.create(
            run=run, seq=1, from_state="", to_state=state.state, kind="launch",
            payload={"patch": run.engine}, actor=actor,
        )
        Message.objects.bulk_create(_message_rows(run, 1, 0, state.messages))
    return run


def commit(
    run: Run, before: RunState, after: RunState, t: Transition, *, actor: str, lease_owner: str | None = None
) -> None:
    """Write one transition and its effects atomically, or raise StaleRun.

    A worker passes its `lease_owner`: the same update renews its lease, so a long run
    costs no extra commit to keep it.
    """
    now = timezone.now()
    cached = cache_fields(after)
    if lease_owner is not None:
        cached["lease_owner"] = lease_owner
        cached["lease_expires"] = now + dt.timedelta(seconds=settings.AIRLOCK_LEASE_SECONDS)
    if t.intent is not None:
        faults.crash_point("before_intent_commit")
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, version=run.version).update(
            version=F("version") + 1,
            updated_at=now,
            finished_at=now if after.state in states.TERMINAL else None,
            **cached,
        )
        if updated != 1:
            # Another worker (or a reviewer, or the sweeper) committed first; their
            # transition stands and ours is dropped with this rollback.
            raise StaleRun(f"run {run.pk} moved past version {run.version}")
        seq = run.version + 1
        TransitionRow.objects.create(
            run=run, seq=seq, from_state=t.from_state, to_state=t.to_state, kind=t.kind,
            payload=clean(t.payload(before, after)), cost_micros=t.cost_micros, tokens=t.tokens,
            duration_ms=t.duration_ms, actor=actor,
        )
        if t.messages:
            Message.objects.bulk_create(_message_rows(run, seq, len(before.messages), t.messages))
        _apply_effects(run, t, now)
    for name, value in cached.items():
        setattr(run, name, value)
    run.version = seq
    run.updated_at = now
    log.info(
        "committed run=%s seq=%s %s->%s kind=%s actor=%s",
        run.pk, seq, t.from_state, t.to_state, t.kind, actor,
    )
    if t.intent is not None:
        faults.crash_point("after_intent_commit")
    faults.crash_point("after_transition_commit")


def _apply_effects(run: Run, t: Transition, now: dt.datetime) -> None:
    if t.intent is not None:
        i = t.intent
        # A retried approval can meet an intent that already exists: keep the first.
        ToolCall.objects.bulk_create(
            [ToolCall(run=run, idempotency_key=i["key"], fingerprint=i["fp"], step=i["step"], call_id=i["call_id"][:200],
                      tool=i["tool"][:100], args=clean(i["args"]))],
            ignore_conflicts=True,
        )
    if t.journal_reset is not None:
        ToolCall.objects.filter(idempotency_key=t.journal_reset).update(status="intended", result=None)
    if t.journal_result is not None:
        r = t.journal_result
        result, chars, truncated = bounded_result(r["result"])
        ToolCall.objects.filter(idempotency_key=r["key"]).update(
            status=r["status"], result=result, result_chars=chars, result_truncated=truncated, finished_at=now
        )
    if t.approval is not None:
        a = t.approval
        Approval.objects.create(
            run=run, kind=a["kind"], idempotency_key=a["key"], call_id=a["call_id"][:200], step=a["step"],
            tool=a["tool"][:100], args=clean(a["args"]), risk=a["risk"], reason=clean(a["reason"]),
            taint_source=clean(a["taint_source"]), status=a["status"],
            decided_at=now if a["status"] != "pending" else None,
        )
    if t.approval_close is not None:
        Approval.objects.filter(run=run, status="pending").update(status=t.approval_close, decided_at=now)


# -- the journal ---------------------------------------------------------------------


class StoreJournal:
    def __init__(self, run: Run) -> None:
        self.run = run

    def get(self, key: str) -> JournalEntry | None:
        row = ToolCall.objects.filter(idempotency_key=key).values("status", "result").first()
        return JournalEntry(row["status"], row["result"]) if row else None

    def executed(self, fingerprint: str) -> int:
        return ToolCall.objects.filter(
            run=self.run, fingerprint=fingerprint, status__in=("succeeded", "failed")
        ).count()

    def begin(self, key: str) -> bool:
        # Committed on its own before the tool runs: after a crash, "started" without a
        # result means the call may have happened.
        with transaction.atomic():
            updated = ToolCall.objects.filter(idempotency_key=key, status="intended").update(
                status="started", attempts=F("attempts") + 1
            )
        # 0 rows: another worker marked it first and is running it; we leave it be.
        return updated == 1


class DjangoRunner(ThreadRunner):
    """Runs tools in a thread with its own database connection, closed afterwards."""

    def call(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            value = super().call(spec, args, ctx)
        finally:
            connection.close()
        faults.crash_point("after_tool_before_result_commit")
        return value


def deps_for(run: Run) -> Deps:
    from agents.llm import client_for
    from agents.tools import registry

    return Deps(
        model=client_for(run.profile, run),
        registry=registry(),
        journal=StoreJournal(run),
        runner=DjangoRunner(),
    )


# -- leases and the driver -----------------------------------------------------------


def claim(run_id: int, owner: str, seconds: float | None = None) -> bool:
    """Take the run's lease by conditional update; True if we hold it now."""
    now = timezone.now()
    seconds = settings.AIRLOCK_LEASE_SECONDS if seconds is None else seconds
    updated = (
        Run.objects.filter(pk=run_id, state__in=states.ACTIVE)
        .filter(Q(lease_owner__isnull=True) | Q(lease_expires__lt=now) | Q(lease_owner=owner))
        .update(lease_owner=owner, lease_expires=now + dt.timedelta(seconds=seconds))
    )
    # 0 rows: another worker holds a live lease (it will finish the run) or the run rests.
    return updated == 1


def release(run_id: int, owner: str) -> None:
    Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_owner=None, lease_expires=None)


def drive(run_id: int, *, max_transitions: int = 10_000, owner: str | None = None, deps: Deps | None = None) -> Run:
    """Step and persist until the run rests.

    1. Claim the lease (a live lease held by someone else: return at once).
    2. Load the state once; then per step call the model or tool outside any
       transaction and commit the transition with the version check.
    3. Stop at a terminal state, a wait for a human, a stale version or the budget of
       transitions; release the lease.
    """
    owner = owner or worker_name()
    if not claim(run_id, owner):
        return Run.objects.get(pk=run_id)
    run = Run.objects.select_related("profile").get(pk=run_id)
    try:
        state = load(run)
        deps = deps or deps_for(run)
        for _ in range(max_transitions):
            outcome = step(state, deps)
            if outcome is None:
                break
            after, t = outcome
            try:
                commit(run, state, after, t, actor=owner, lease_owner=owner)
            except StaleRun:
                log.info("stale run=%s version=%s: another actor moved it; dropping our step", run.pk, run.version)
                break
            state = after
    finally:
        release(run_id, owner)
    run.refresh_from_db()
    return run
