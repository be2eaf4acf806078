"""The worker's side of a run: `advance` (what one `advance_run` task does) and the
lease heartbeat that keeps a long step's lease alive."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import connection

from agents import broker
from agents.runs import driver, store

log = logging.getLogger("airlock.tasks")


def advance(run_id: int, *, redelivered: bool) -> None:
    """Drive one run for a bounded number of transitions, then hand it back to the queue.

    1. Skip runs that ended or wait for a human (a duplicate wake-up lands here).
    2. Drive under the lease, with a heartbeat keeping the lease alive through a long
       tool call; the driver returns at once if another worker holds the lease.
    3. Still advancing and released by us (the budget ran out): enqueue again, so a long
       run takes its turn behind the others instead of holding a worker.
    """
    current = store.read_run(run_id)
    if current is None or current.state not in store.ADVANCING or store.waits_for_client(current):
        state = None if current is None else current.state
        log.info("advance_run run=%s no-op: state=%s redelivered=%s", run_id, state, redelivered)
        return
    owner = driver.worker_name()
    with lease_heartbeat(run_id, owner):
        run = driver.drive(
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
    if run.state in store.ADVANCING and run.lease_owner is None and not store.waits_for_client(run):
        broker.wake_run(run_id)


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
        return driver.lease_renew(pairs)


heartbeat = LeaseHeartbeat()


def lease_heartbeat(run_id: int, owner: str) -> contextlib.AbstractContextManager[None]:
    """Keep our lease on `run_id` alive while the block runs (see LeaseHeartbeat)."""
    return heartbeat.holding(run_id, owner)
