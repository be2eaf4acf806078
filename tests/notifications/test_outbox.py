"""Outbox rows are written by the transition that caused them, in its transaction, by
both of the store's commit paths; a transition that rolls back leaves no event."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_cancel
from agents.engine.human import cancel
from agents.engine.run import Move
from agents.engine.step import step
from agents.models import Approval, OutboxEvent, Run
from agents.notifications import events as outbox
from agents.runs import driver, store
from tests.helpers import at_once, call, final, person, requires_postgres

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["one_statement", "orm"])
def commit_path(request: pytest.FixtureRequest, settings: Any) -> str:
    # On PostgreSQL the store writes a transition as one statement; the ORM path is
    # SQLite's, and PostgreSQL's with AIRLOCK_STORE_ONE_STATEMENT=0. Both must agree.
    settings.AIRLOCK_STORE_ONE_STATEMENT = request.param == "one_statement"
    return request.param


def events(run: Run) -> list[tuple[str, int | None]]:
    return list(OutboxEvent.objects.filter(run=run).order_by("pk").values_list("type", "approval_id"))


def test_a_finished_run_writes_one_event_and_the_steps_before_none(commit_path, launch, drive) -> None:
    run = drive(launch([call("echo", text="a"), call("echo", text="b"), final("ok")]))
    assert run.state == "done" and run.transitions.count() == 7
    assert events(run) == [("run.done", None)]
    event = OutboxEvent.objects.get(run=run)
    assert event.created_at == run.finished_at  # stamped by the same commit
    assert event.msg_id.startswith("msg_") and event.data is None and event.dispatched_at is None


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_approval_lifecycle_events_name_the_approval(commit_path, waiting, drive) -> None:
    approval = waiting()
    assert events(approval.run) == [("approval.pending", approval.pk)]
    approval_decide(approval_id=approval.pk, user=person("rita", "reviewer"), decision="approve")
    run = drive(approval.run)
    assert run.state == "done"
    assert events(run) == [("approval.pending", approval.pk), ("approval.decided", approval.pk), ("run.done", None)]


def test_a_failed_run_writes_run_failed(commit_path, launch, drive) -> None:
    run = drive(launch([call("nope")] * 3 + [final()]))
    assert run.state == "failed"
    assert events(run) == [("run.failed", None)]


def test_cancelling_a_waiting_run_expires_its_approval(commit_path, waiting) -> None:
    approval = waiting()
    run_cancel(run_id=approval.run_id, user=person("otto", "operator"))
    approval.refresh_from_db()
    assert approval.status == "expired"
    assert events(approval.run) == [
        ("approval.pending", approval.pk),
        ("approval.expired", approval.pk),
        ("run.cancelled", None),
    ]


def test_a_decision_that_fails_the_run_is_a_decision_not_an_expiry(commit_path, launch) -> None:
    run = launch([final()])
    state = store.load(run)
    # An "outcome unknown" question, as resume asks it after an unsafe tool's crash.
    state.state, state.approval = "awaiting_approval", {"kind": "outcome_unknown", "reason": "crashed"}
    state.current_call = {"id": "c1", "tool": "ledger_write_unsafe", "key": "k" * 64, "fp": "f"}
    Run.objects.filter(pk=run.pk).update(state="awaiting_approval", engine=state.engine_json())
    approval = Approval.objects.create(
        run=run,
        kind="outcome_unknown",
        idempotency_key="k" * 64,
        call_id="c1",
        tool="ledger_write_unsafe",
        args={},
        risk="write",
        reason="crashed",
    )
    approval_decide(approval_id=approval.pk, user=person("rita", "reviewer"), decision="fail", note="no idea")
    assert Run.objects.get(pk=run.pk).state == "failed"
    assert events(run) == [("approval.decided", approval.pk), ("run.failed", None)]


def test_no_event_when_the_transition_rolls_back(commit_path, waiting) -> None:
    approval = waiting()
    with pytest.raises(RuntimeError), transaction.atomic():
        approval_decide(approval_id=approval.pk, user=person("rita", "reviewer"), decision="reject")
        assert OutboxEvent.objects.filter(type="approval.decided").count() == 1  # written inside...
        raise RuntimeError("the request died before its commit")
    assert OutboxEvent.objects.filter(type="approval.decided").count() == 0  # ...and gone with it
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_a_stale_commit_writes_no_event(commit_path, launch) -> None:
    run = launch([final()])
    state = store.load(run)
    after, t = cancel(state, "too late")
    Run.objects.filter(pk=run.pk).update(version=5)  # someone else moved it first
    with pytest.raises(store.StaleRun):
        store.commit(run, state, after, t, actor="test")
    assert OutboxEvent.objects.count() == 0


@pytest.mark.parametrize(
    ("transition", "expected"),
    [
        (Move("queued", "planning", "pickup"), ()),
        (Move("planning", "acting", "model"), ()),
        (Move("acting", "planning", "tool"), ()),
        (Move("planning", "done", "model"), ("run.done",)),
        (Move("planning", "failed", "fail"), ("run.failed",)),
        (Move("planning", "cancelled", "cancel"), ("run.cancelled",)),
        (Move("planning", "planning", "call", approval={"status": "denied"}), ()),
        (Move("planning", "awaiting_approval", "call", approval={"status": "pending"}), ("approval.pending",)),
        (Move("awaiting_approval", "acting", "decision", {"decision": "approve"}), ("approval.decided",)),
        (
            Move("awaiting_approval", "failed", "fail", {"reason": "deadline"}, approval_close="expired"),
            ("approval.expired", "run.failed"),
        ),
    ],
)
def test_events_for_a_transition(transition: Move, expected: tuple[str, ...]) -> None:
    assert tuple(e.type for e in outbox.events_for(transition)) == expected


def test_emit_writes_in_the_callers_transaction(waiting) -> None:
    approval = waiting()
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.emit("approval.expiring", approval)
        raise RuntimeError("rolled back")
    assert not OutboxEvent.objects.filter(type="approval.expiring").exists()
    with transaction.atomic():
        event = outbox.emit("approval.expiring", approval)
    assert (event.type, event.approval_id, event.run_id) == ("approval.expiring", approval.pk, approval.run_id)
    with pytest.raises(ValueError, match="unknown event type"):
        outbox.emit("approval.exploded", approval)


@requires_postgres()
@pytest.mark.parametrize("kind", ["no_event", "events"])
def test_a_transition_stays_one_statement_with_or_without_events(
    kind: str, settings, launch, django_assert_num_queries
) -> None:
    settings.AIRLOCK_STORE_ONE_STATEMENT = True
    run = Run.objects.select_related("profile").get(pk=launch([final()]).pk)
    state = store.load(run)
    after, t = cancel(state, "stop") if kind == "events" else step(state, driver.deps_for(run))
    assert bool(outbox.events_for(t)) == (kind == "events")
    with django_assert_num_queries(1):
        store.commit(run, state, after, t, actor="test")
    assert OutboxEvent.objects.filter(run=run).count() == (1 if kind == "events" else 0)


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_emit_once_writes_one_warning_however_many_sweepers_find_it(waiting) -> None:
    approval = waiting()
    results = at_once(lambda _: outbox.emit_once("approval.expiring", approval), range(4))
    assert sum(r is not None for r in results) == 1
    assert OutboxEvent.objects.filter(approval=approval, type="approval.expiring").count() == 1
    assert outbox.emit_once("approval.expiring", approval) is None
    assert outbox.emit_once("approval.expired", approval) is not None  # another type is another event
