"""Celery tasks, thin shells around the driver: `advance_run` and the sweeper.

The database is the truth and broker messages are only wake-ups: a duplicate delivery
finds the run leased or already advanced and does nothing, a lost one is replaced by
the sweeper.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agents import actions, notify, store
from agents.engine import limits, states
from agents.engine import step as engine
from agents.models import Approval, Run

log = logging.getLogger("airlock.tasks")

ADVANCING = store.ADVANCING
SWEEP_BATCH = 500


def wake(run_id: int) -> None:
    """Wake a worker for a run: a hint, never the truth.

    Called after commit (launch, approval) and by the sweeper. It never raises into the
    caller: with the broker down the launch or decision still stands, and the sweeper
    sends the wake-up once the broker is back. No retry loop either: it runs inside a
    web request's on_commit hook.
    """
    try:
        advance_run.apply_async((run_id,), retry=False)
    except Exception as exc:  # noqa: BLE001 - any broker failure is the sweeper's job
        log.warning(
            "wake-up for run=%s not sent (%s: %s); the sweeper will pick the run up",
            run_id,
            type(exc).__name__,
            exc,
        )


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def advance_run(self: Any, run_id: int) -> None:
    """Drive one run for a bounded number of transitions, then hand it back to the queue.

    1. Skip runs that ended or wait for a human (a duplicate wake-up lands here).
    2. Drive under the lease, with a heartbeat keeping the lease alive through a long
       tool call; the driver returns at once if another worker holds the lease.
    3. Still advancing and released by us (the budget ran out): enqueue again, so a long
       run takes its turn behind the others instead of holding a worker.
    """
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    current = store.read_run(run_id)
    if current is None or current.state not in ADVANCING:
        state = None if current is None else current.state
        log.info("advance_run run=%s no-op: state=%s redelivered=%s", run_id, state, redelivered)
        return
    owner = store.worker_name()
    with lease_heartbeat(run_id, owner):
        run = store.drive(
            run_id,
            max_transitions=settings.AIRLOCK_TASK_TRANSITIONS,
            max_seconds=settings.AIRLOCK_TASK_SECONDS,
            owner=owner,
            run=current,
        )
    if run.lease_owner not in (None, owner):
        # Another worker holds a live lease (a duplicate or redelivered wake-up): it
        # advances the run; this delivery wrote nothing.
        log.info(
            "advance_run run=%s no-op: leased by %s redelivered=%s", run.pk, run.lease_owner, redelivered
        )
        return
    log.info("advance_run run=%s state=%s seq=%s lease=%s", run.pk, run.state, run.version, run.lease_owner or "-")
    if run.state in ADVANCING and run.lease_owner is None:
        wake(run_id)


class LeaseHeartbeat:
    """Renews the leases of every run this process is driving, from one thread.

    Commits renew a lease too, but one step (a slow tool, a slow model) can outlast it;
    then another worker would take the run over from a live one. A threaded worker
    drives dozens of runs at once: one thread renews them all with one UPDATE every
    third of a lease and hands its connection back between beats, instead of a thread
    and a held connection per run. The thread dies with the process, so a killed
    worker's leases all expire on time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (run id, owner) pairs: two threads of one process may both hold a wake-up for
        # the same run (only one holds its lease), so the run id alone is no key.
        self._held: set[tuple[int, str]] = set()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextlib.contextmanager
    def holding(self, run_id: int, owner: str) -> Iterator[None]:
        with self._lock:
            self._held.add((run_id, owner))
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                # First use in this process (a prefork child inherits no threads).
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._held.discard((run_id, owner))

    def held(self) -> set[tuple[int, str]]:
        with self._lock:
            return set(self._held)

    def _beat(self) -> None:
        while True:
            time.sleep(settings.AIRLOCK_LEASE_SECONDS / 3)
            pairs = self.held()
            if not pairs:
                continue
            try:
                self.renew(pairs)
            except Exception:  # noqa: BLE001 - a missed beat only shortens the leases
                log.warning("lease heartbeat missed a beat for %s runs", len(pairs), exc_info=True)
            finally:
                connection.close()

    @staticmethod
    def renew(pairs: set[tuple[int, str]]) -> int:
        return store.lease_renew(pairs)


heartbeat = LeaseHeartbeat()


def lease_heartbeat(run_id: int, owner: str) -> contextlib.AbstractContextManager[None]:
    """Keep our lease on `run_id` alive while the block runs (see LeaseHeartbeat)."""
    return heartbeat.holding(run_id, owner)


@shared_task(ignore_result=True)
def sweep() -> dict[str, int]:
    """Find the runs nobody is advancing; safe with any number of sweepers at once.

    1. Fail runs past their deadline that no live worker holds, those waiting for a
       human included (their approval expires): claim, step through the store with the
       version check, release. A run a worker holds fails at that worker's next step.
    2. Expire approvals past their `expires_at` (`actions.approval_expire`).
    3. Re-enqueue queued/planning/acting runs whose lease expired (a worker died), or
       that nobody holds and that have had no transition for AIRLOCK_IDLE_SECONDS (a
       lost wake-up, a broker that was down). A conditional update stamping the wake-up
       picks the one sweeper that sends it and holds the next one back for an idle
       period.
    """
    now = timezone.now()
    # Per thread, as a worker's name is: two sweeps in one threaded worker are two owners.
    owner = f"sweeper:{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"
    free = Q(lease_owner__isnull=True) | Q(lease_expires__lt=now)
    late = list(
        Run.objects.filter(state__in=states.ACTIVE, deadline__lte=now)
        .filter(free)
        .order_by("deadline")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    failed = sum(1 for pk in late if _fail_late(pk, owner))
    # Approvals nobody answered in time (their run's deadline is still ahead).
    due = list(
        Approval.objects.pending()
        .filter(expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    expired = sum(1 for pk in due if actions.approval_expire(approval_id=pk, owner=owner))
    expiring = _warn_expiring(now)
    woken = 0
    for pk in store.unattended_runs(now, SWEEP_BATCH):
        if not store.stamp_wakeup(pk, now):
            continue  # another sweeper stamped it first (and sent the wake-up), or a worker took it
        wake(pk)
        woken += 1
    if failed or woken or expired or expiring:
        log.info("sweep failed=%s woken=%s expired=%s expiring=%s", failed, woken, expired, expiring)
    return {"failed": failed, "expired": expired, "expiring": expiring, "woken": woken}


def _warn_expiring(now: dt.datetime) -> int:
    """Write `approval.expiring` once for each pending approval with under a fifth of
    its time left; `outbox.emit_once` keeps concurrent sweepers to one event."""
    from agents import outbox
    from agents.models import OutboxEvent

    warned = OutboxEvent.objects.filter(approval=OuterRef("pk"), type="approval.expiring")
    soonest = (
        Approval.objects.pending()
        .filter(expires_at__gt=now)
        .exclude(Exists(warned))
        .order_by("expires_at")[:SWEEP_BATCH]
    )
    count = 0
    for approval in soonest:
        assert approval.expires_at is not None
        if approval.expires_at - now > (approval.expires_at - approval.created_at) / 5:
            continue  # more than a fifth left (timeouts differ, so keep looking)
        if outbox.emit_once("approval.expiring", approval) is not None:
            count += 1
    return count


def _fail_late(run_id: int, owner: str) -> bool:
    """Fail a run past its deadline; False if a worker (or another sweeper) holds it and
    fails it itself, or a reviewer or operator moved it first."""

    def late(run: Run, state: engine.RunState) -> engine.Outcome | None:
        now = time.time()
        if state.state in states.TERMINAL:
            # Two sweepers in one process share an owner name, so both "held" the lease;
            # the other one failed the run between our claim and our load.
            return None
        if state.state == states.AWAITING_APPROVAL:
            # The engine's own rule for a waiting run: fail it and expire its approval.
            return engine.step(state, store.clock_only(run, now))
        return engine.fail(state, limits.exceeded(state, now) or "deadline passed")

    return store.step_once(run_id, owner, late) is not None


@shared_task(ignore_result=True)
def deliver_notifications() -> dict[str, int]:
    """Fan out new outbox events, attempt the due webhook deliveries, send a due digest.

    Woken after a commit that wrote events and run by the beat (retries wait there, not
    in the broker). Safe with any number at once; see `agents.notify`.
    """
    return notify.dispatch()
