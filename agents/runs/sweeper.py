"""The sweeper: what nobody else will do for a run (a dead worker's lease, a lost
wake-up, a deadline passed while a human was away, an approval nobody answered)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agents import broker
from agents.actions import claims
from agents.actions.approvals import approval_escalate, approval_expire
from agents.engine import limits, states
from agents.engine.run import Outcome, RunState, fail
from agents.engine.step import step
from agents.models import AgentProfile, Approval, OutboxEvent, Run
from agents.notifications import events as outbox
from agents.ops import review_tally
from agents.runs import driver

log = logging.getLogger("airlock.tasks")

SWEEP_BATCH = 500


def sweep() -> dict[str, int]:
    """Find the runs nobody is advancing; safe with any number of sweepers at once.

    1. Fail runs past their deadline that no live worker holds, those waiting for a
       human included (their approval expires): take the lease, step through the store with the
       version check, release. A run a worker holds fails at that worker's next step.
    2. Expire approvals past their `expires_at` (`approval_expire`), warn of
       those about to (`approval.expiring`), escalate those waiting longer than their
       profile's `escalate_after_seconds` (`approval_escalate`), and record the
       reviewers' claims whose time ran out as lapsed (`claims.claims_lapse`), and fold
       the calls closed since into the review statistics' tallies.
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
    expired = sum(1 for pk in due if approval_expire(approval_id=pk, owner=owner))
    expiring = _warn_expiring(now)
    lapsed = claims.claims_lapse(now=now)
    escalated = _escalate(now)
    # The review statistics' tallies: the calls closed since the last pass.
    tallied = review_tally.approvals_tally()
    woken = 0
    for pk in driver.unattended_runs(now, SWEEP_BATCH):
        if not driver.stamp_wakeup(pk, now):
            continue  # another sweeper stamped it first (and sent the wake-up), or a worker took it
        broker.wake_run(pk)
        woken += 1
    if failed or woken or expired or expiring or escalated or lapsed:
        log.info(
            "sweep failed=%s woken=%s expired=%s expiring=%s escalated=%s lapsed_claims=%s",
            failed, woken, expired, expiring, escalated, lapsed,
        )
    return {
        "failed": failed, "expired": expired, "expiring": expiring, "escalated": escalated, "woken": woken,
        "lapsed_claims": lapsed, "tallied": tallied,
    }


def _escalate(now: dt.datetime) -> int:
    """Escalate the calls still pending `escalate_after_seconds` after they were asked
    (`approval_escalate`, once each however many sweepers find them). Per
    profile, as profiles are few and their waits differ: each query is a range of the
    pending calls by age, and a long wait on one profile never hides another's due calls."""
    profiles = AgentProfile.objects.filter(escalate_after_seconds__isnull=False).exclude(backup_group="")
    count = 0
    for profile_id, seconds in profiles.values_list("pk", "escalate_after_seconds"):
        due = list(
            Approval.objects.pending()
            .filter(run__profile_id=profile_id, escalated_at__isnull=True)
            .filter(created_at__lte=now - dt.timedelta(seconds=seconds))
            .order_by("created_at")
            .values_list("pk", flat=True)[:SWEEP_BATCH]
        )
        count += sum(1 for pk in due if approval_escalate(approval_id=pk, now=now))
    return count


def _warn_expiring(now: dt.datetime) -> int:
    """Write `approval.expiring` once for each pending approval with under a fifth of
    its time left; `outbox.emit_once` keeps concurrent sweepers to one event."""
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

    def late(run: Run, state: RunState) -> Outcome | None:
        now = time.time()
        if state.state in states.TERMINAL:
            # Two sweepers in one process share an owner name, so both "held" the lease;
            # the other one failed the run between our lease and our load.
            return None
        if state.state == states.AWAITING_APPROVAL:
            # The engine's own rule for a waiting run: fail it and expire its approval.
            return step(state, driver.clock_only(run, now))
        return fail(state, limits.exceeded(state, now) or "deadline passed")

    return driver.step_once(run_id, owner, late) is not None
