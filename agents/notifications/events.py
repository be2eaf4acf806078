"""The outbox: events written in the same transaction as the transition that caused them.

`events_for(t)` is the one rule from a transition to its events; the store applies it
in both of its commit paths (one PostgreSQL statement, or the ORM). Code that raises an
event outside a transition calls `emit()` inside its own transaction, or `emit_once()`
for a warning a periodic job may find more than once (`approval.expiring`).
Delivery is `agents.notifications.delivery`'s job, woken after commit and by the beat.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass
from typing import Literal

from django.db import transaction
from django.utils import timezone

from agents import broker
from agents.engine import decisions, states
from agents.engine.run import Move
from agents.models import EVENT_TYPES, Approval, OutboxEvent, Run

log = logging.getLogger("airlock.outbox")

# Which approval an approval event is about, as the store can name it in SQL:
# "created" the one this transition inserts, "closed" the pending one it closes,
# "current" the run's newest (the one a decision just answered).
Subject = Literal["created", "closed", "current"]


@dataclass(frozen=True)
class Event:
    type: str
    approval: Subject | None = None  # None: an event about the run


def events_for(t: Move) -> tuple[Event, ...]:
    """The events a transition causes. Pure and cheap: most transitions cause none,
    and then the store writes nothing more."""
    events: list[Event] = []
    if t.approval is not None and t.approval.get("status") == decisions.PENDING:
        events.append(Event("approval.pending", "created"))
    if t.from_state == states.AWAITING_APPROVAL and "decision" in t.detail:
        events.append(Event("approval.decided", "current"))
    if t.approval_close == decisions.EXPIRED:
        # Only if a pending approval is there to close; the store's join decides.
        events.append(Event("approval.expired", "closed"))
    if t.to_state in states.TERMINAL:
        events.append(Event(f"run.{t.to_state}"))
    return tuple(events)


def new_msg_id() -> str:
    """The `webhook-id`: random, so ids never repeat even across databases."""
    return "msg_" + secrets.token_hex(12)


def rows(
    run_id: int, events: tuple[Event, ...], *, created: int | None, closed: list[int], now: dt.datetime
) -> list[OutboxEvent]:
    """Unsaved rows for the ORM path (the statement path builds the same in SQL)."""
    out: list[OutboxEvent] = []
    for e in events:
        if e.approval is None:
            out.append(OutboxEvent(msg_id=new_msg_id(), type=e.type, run_id=run_id, created_at=now))
            continue
        if e.approval == "created":
            ids = [created] if created is not None else []
        elif e.approval == "closed":
            ids = list(closed)
        else:
            newest = Approval.objects.filter(run_id=run_id).order_by("-pk").values_list("pk", flat=True).first()
            ids = [newest] if newest is not None else []
        out += [
            OutboxEvent(msg_id=new_msg_id(), type=e.type, run_id=run_id, approval_id=pk, created_at=now) for pk in ids
        ]
    return out


def emit(event_type: str, subject: Approval | Run) -> OutboxEvent:
    """Write one event about `subject` in the caller's transaction (for changes that are
    not transitions, such as an approval expiring). Nothing is sent before it commits."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}; known: {', '.join(EVENT_TYPES)}")
    if isinstance(subject, Approval):
        row = OutboxEvent(msg_id=new_msg_id(), type=event_type, run_id=subject.run_id, approval=subject)
    else:
        row = OutboxEvent(msg_id=new_msg_id(), type=event_type, run=subject)
    row.created_at = timezone.now()
    row.save()
    wake_after_commit()
    return row


def emit_once(event_type: str, approval: Approval) -> OutboxEvent | None:
    """`emit()`, unless this approval already has an event of this type: for warnings a
    periodic job raises (`approval.expiring`), however many sweepers find it at once.
    None when it was already written."""
    with transaction.atomic():
        # The approval's row lock puts concurrent sweepers in line; the later one sees
        # the event the first one wrote and writes nothing.
        Approval.objects.select_for_update().filter(pk=approval.pk).values_list("pk").first()
        if OutboxEvent.objects.filter(approval=approval, type=event_type).exists():
            return None
        return emit(event_type, approval)


def wake_after_commit() -> None:
    transaction.on_commit(broker.wake_delivery)
