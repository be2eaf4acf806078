"""The driver: a worker's lease on a run, the journal and tool runner a drive uses, the
drive loop itself, the sweeper's one step under a lease and the poison-run rule."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from django.conf import settings
from django.db import connection
from django.db.models import F, Q
from django.utils import timezone

from agents.engine import states
from agents.engine.protocols import Deps, JournalEntry, ModelClient, ModelReply, ModelRequest, ThreadRunner
from agents.engine.registry import Registry, ToolContext, ToolSpec
from agents.engine.run import Move, Outcome, RunState, fail
from agents.engine.step import step
from agents.lib import faults, rows
from agents.llm import client_for
from agents.models import Run, ToolCall
from agents.ops.logs import bind_run
from agents.runs import statement
from agents.runs.history import HistoryMoved, StoreHistory
from agents.runs.store import (
    ADVANCING,
    StaleRun,
    commit,
    lease_free,
    load,
    read_run,
    rests_for_client,
    waits_for_client_q,
)
from agents.tools import registry_for

log = logging.getLogger("airlock.store")


def worker_name() -> str:
    """This thread's name as a lease owner: host, process and thread.

    A threaded worker drives many runs in one process; were the owner only the process,
    a duplicate wake-up on a second thread would pass `take_lease`'s "we hold it already"
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


# -- the journal ---------------------------------------------------------------------


# How many times a call of one fingerprint ran to an end in a run (params: run id,
# fingerprint): the repeat count the engine checks a new call against.
REPEATS = (
    "SELECT COUNT(*) FROM agents_toolcall WHERE run_id = %s AND fingerprint = %s AND status IN ('succeeded', 'failed')"
)


class StoreJournal:
    """The journal of one run, for one driver.

    It remembers what this driver itself wrote (intents, results) so the happy path
    reads nothing back; anything it did not write is read from the database. Only the
    lease holder drives a run, and a stale driver's commits are refused anyway.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self.known: dict[str, JournalEntry] = {}
        # How many times each fingerprint asked about ran to an end (succeeded or
        # failed); `empty`: the run has run nothing, so every count is 0.
        self.counts: dict[str, int] = {}
        self.empty = False

    def starts_empty(self) -> None:
        """The run has not been picked up yet, so it has run no tool: nothing to count."""
        self.empty = True

    def get(self, key: str) -> JournalEntry | None:
        if key in self.known:
            return self.known[key]
        row = ToolCall.objects.filter(idempotency_key=key).values("status", "result").first()
        return JournalEntry(row["status"], row["result"]) if row else None

    def executed(self, fingerprint: str) -> int:
        if fingerprint not in self.counts and not self.empty:
            # Only this fingerprint, through the (run, fingerprint) index, so the count
            # costs the same however many calls the run has made; written out and
            # prepared (agents/lib/rows.py): every proposal of an external run asks.
            self.counts[fingerprint] = rows.fetch(REPEATS, [self.run.pk, fingerprint], prepared=True)[0][0]
        return self.counts.get(fingerprint, 0)

    def begin(self, key: str) -> bool:
        # Committed on its own before the tool runs (one statement, so no transaction
        # around it): after a crash, "started" without a result means the call may
        # have happened.
        updated = ToolCall.objects.filter(idempotency_key=key, status="intended").update(
            status="started", attempts=F("attempts") + 1
        )
        # 0 rows: another worker marked it first and is running it; we leave it be.
        if updated == 1:
            self.known[key] = JournalEntry("started")
        return bool(updated == 1)

    def committed(self, t: Move) -> None:
        """Remember the journal effects of a transition this driver committed."""
        if t.intent is not None:
            self.known.setdefault(t.intent["key"], JournalEntry("intended"))
        if t.journal_reset is not None:
            self.known[t.journal_reset] = JournalEntry("intended")
        if t.journal_result is not None:
            r = t.journal_result
            self.known[r["key"]] = JournalEntry(r["status"], statement.result_fields(r)["result"])
            if r["fp"] in self.counts or self.empty:
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

    def propose(self, request: ModelRequest) -> ModelReply | None:
        release_connection()
        return self.inner.propose(request)


def deps_for(run: Run, tools: list[str] | None = None) -> Deps:
    """`tools`: the run's snapshotted tool names (None: all), so a drive builds only the
    MCP tools its run may call."""
    model = client_for(run.profile, run)
    return Deps(
        model=ReleasingModel(model) if getattr(model, "waits", True) else model,
        # With an external profile's client tools: the engine rests on them, never runs them.
        registry=registry_for(run.profile, tools),
        journal=StoreJournal(run),
        runner=DjangoRunner(),
        history=StoreHistory(run),
    )


class SameTurn:
    """A model client that answers a turn it answered already with the same reply:
    a step judged again because its history figures moved (HistoryMoved) must not ask
    the model again (it costs, and it may answer otherwise)."""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner
        self.last: tuple[str, int, ModelReply | None] | None = None

    def propose(self, request: ModelRequest) -> ModelReply | None:
        if self.last is not None and self.last[:2] == (request.run_id, request.turn):
            return self.last[2]
        reply = self.inner.propose(request)
        self.last = (request.run_id, request.turn, reply)
        return reply


# How many times a worker judges one step again because history rules' figures moved
# before its commit (another run's call of the same scope committed first).
HISTORY_RETRIES = 50


# -- leases and the driver -----------------------------------------------------------


def take_lease(run_id: int, owner: str, seconds: float | None = None, *, version: int | None = None) -> bool:
    """Take the run's lease by conditional update; True if we hold it now. With
    `version`, only while the run is still at that version (what the caller read)."""
    now = timezone.now()
    seconds = settings.AIRLOCK_LEASE_SECONDS if seconds is None else seconds
    current = Run.objects.filter(pk=run_id, state__in=states.ACTIVE)
    if version is not None:
        current = current.filter(version=version)
    updated = (
        current.filter(lease_free(owner, now))
        .update(
            lease_owner=owner,
            lease_expires=now + dt.timedelta(seconds=seconds),
            # Counted in the same update: a lease whose worker dies before it commits a
            # transition or releases cleanly stays counted (see `drive`).
            claims_without_progress=F("claims_without_progress") + 1,
        )
    )
    # 0 rows: another worker holds a live lease (it will finish the run) or the run rests.
    return bool(updated == 1)


def release(run_id: int, owner: str, *, clean: bool = True) -> None:
    """Give the lease back; a clean release also clears the count of dead leases.

    `clean=False` (the driver raised: a crash, a time limit) leaves the lease counted,
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
    return int(Run.objects.filter(held).update(lease_expires=expires))


def _unattended(now: dt.datetime) -> Q:
    # A dead worker's lease (or an old wake-up stamp) has expired; a run never held
    # since its last release has been idle. A sent wake-up is stamped as an owner-less
    # `lease_expires` ("woken until"), which take_lease() ignores.
    idle_since = now - dt.timedelta(seconds=settings.AIRLOCK_IDLE_SECONDS)
    return Q(lease_expires__lt=now) | Q(lease_owner__isnull=True, lease_expires__isnull=True, updated_at__lt=idle_since)


def unattended_runs(now: dt.datetime, limit: int) -> list[int]:
    """Runs a worker should advance and nobody is advancing, the longest idle first."""
    return list(
        Run.objects.filter(state__in=ADVANCING)
        .exclude(waits_for_client_q())
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
    return bool(stamped == 1)


def step_once(run_id: int, owner: str, decide: Callable[[Run, RunState], Outcome | None]) -> Run | None:
    """Step a run nobody is driving once, for the sweeper; the run if this call
    committed a transition, None if it wrote nothing.

    1. Take the lease (a worker or another sweeper holds it: leave it to them).
    2. Load the state and let `decide` compute the transition (None: nothing to do).
    3. Commit with the version check: whoever moved the run first (a reviewer, an
       operator) keeps their transition. Release the lease, cleanly unless we raised.
    """
    if not take_lease(run_id, owner, seconds=max(settings.AIRLOCK_LEASE_SECONDS, 30)):
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
        return cast(Run, run)
    finally:
        release(run_id, owner, clean=clean)


def poison_reason(leases: int) -> str | None:
    """Why a run is given up after its leases kept dying, or None while it may go on."""
    limit = settings.AIRLOCK_MAX_DEAD_CLAIMS
    dead = leases - 1  # the lease just taken is alive
    if dead < limit:
        return None
    return (
        f"poison run: {dead} worker leases in a row ended without progress "
        f"(the worker died or the step crashed each time; AIRLOCK_MAX_DEAD_CLAIMS {limit})"
    )


def _leased(run: Run, owner: str) -> Run | None:
    """`run` under our lease, read again only if it moved since the caller read it;
    None when someone else holds the lease or the run rests."""
    if take_lease(run.pk, owner, version=run.version):
        run.lease_owner = owner
        run.claims_without_progress += 1
        return run
    if take_lease(run.pk, owner):  # it moved between the read and the lease
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
    state: RunState | None = None,
    leased: bool = False,
) -> Run:
    """Step and persist until the run rests.

    1. Read the run and take its lease (a live lease held by someone else: return at
       once). A queued run is leased by its first commit, the pickup, instead.
    2. Load the state once; then per step call the model or tool outside any
       transaction and commit the transition with the version check.
    3. Stop at a terminal state, a wait for a human, a stale version, the budget of
       transitions or of seconds; release the lease (cleanly unless we raised).

    A run whose previous leases all died without progress is failed instead of stepped.
    `deps` are the model, tools and journal to step with, or a function making them
    from the run (by default `deps_for`). `run` is the run as the caller just read it
    (with its profile), which saves reading it again; a run that moved since is read
    again after the lease. `state` is the state the caller's own commit left `run` in
    (the decision API's proposal), which saves loading the transcript again; it is used
    only when the lease finds `run`'s version unmoved, so it is the state of record.
    `leased`: the caller's commit that left `run` in `state` also took the lease for
    `owner` (the decision API's proposal of a call Airlock runs), so there is nothing
    to take. A commit after which the run rests for its external client gives the
    lease back itself, and the drive stops there.
    """
    owner = owner or worker_name()
    if run is None:
        run = read_run(run_id)
        if run is None:
            raise Run.DoesNotExist(f"no run {run_id}")
    # A queued run's first step is the pickup, which calls nothing: its commit takes
    # the lease (one commit, not two). A lease that died before it is counted the
    # usual way, so the poison count still sees it.
    leasing = run.state == states.QUEUED and run.claims_without_progress == 0 and not leased
    if leased:
        assert state is not None and run.lease_owner == owner, "a leased drive needs the caller's run and state"
    elif not leasing:
        leased_run = _leased(run, owner)
        if leased_run is None:
            return cast(Run, Run.objects.get(pk=run_id))
        if leased_run is not run:
            state = None  # it moved between the caller's commit and our lease: load it
        run = leased_run
    else:
        state = None  # a pickup: nobody's commit precedes it
    clean_exit = ended = False
    started = time.monotonic()
    unbind = bind_run(run.pk, run.trace_context)  # log lines name the run and its trace
    bound: Deps | None = None  # the deps this drive steps with, once made
    try:
        state = state if state is not None else load(run)
        reason = poison_reason(run.claims_without_progress)
        if reason is not None:
            _fail_poison(run, state, reason, owner)
        else:
            bound = deps(run) if callable(deps) else deps or deps_for(run, state.tools)
            if bound.history is not None:
                bound = dataclasses.replace(bound, model=SameTurn(bound.model))
            if state.state == states.QUEUED and isinstance(bound.journal, StoreJournal):
                bound.journal.starts_empty()
            moved = 0
            for _ in range(max_transitions):
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                outcome = step(state, bound)
                if outcome is None:
                    break
                after, t = outcome
                try:
                    commit(run, state, after, t, actor=owner, lease_owner=owner, take_lease=leasing, recheck_history=True)
                    if isinstance(bound.journal, StoreJournal):
                        bound.journal.committed(t)
                except HistoryMoved:
                    # Another run's call counted by one of our history rules committed
                    # between our judgement and our commit: judge this step again with
                    # the figures as they are now (the model is not asked again).
                    moved += 1
                    if moved > HISTORY_RETRIES:
                        log.warning("run=%s: history figures kept moving; leaving the step to the sweeper", run.pk)
                        break
                    continue
                except StaleRun:
                    log.info("stale run=%s version=%s: another actor moved it; dropping our step", run.pk, run.version)
                    break
                leasing = False
                moved = 0
                state = after
                # The terminal commit (or one after which the run waits for its client)
                # released the lease and left `run` current.
                ended = after.state in states.TERMINAL or rests_for_client(run, after)
                if ended:
                    break
        clean_exit = True
    finally:
        if not ended and not leasing:
            release(run_id, owner, clean=clean_exit)
        # The tool thread ends with the drive (a worker drives thousands of runs).
        close = getattr(bound.runner, "close", None) if bound is not None else None
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
