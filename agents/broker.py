"""Wake-ups, sent to Celery by task name: the bottom of the house.

The database is the truth and a broker message is only a hint that there is work. The
code that asks for a wake-up (actions, the store, the sweeper, the outbox) imports this
module and never the tasks, so no circle runs through `agents.tasks`; the task names
below are the ones `agents/tasks.py` registers. Nothing here raises into the caller: a
lost wake-up costs latency, and the sweeper (runs) or the beat (deliveries) covers it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import current_app

log = logging.getLogger("airlock.tasks")

ADVANCE_RUN = "agents.tasks.advance_run"
DELIVER_NOTIFICATIONS = "agents.tasks.deliver_notifications"


def send(name: str, args: tuple[Any, ...] = ()) -> None:
    """Publish one task message; no retry loop (it may run inside a web request's
    on_commit hook, and the sweeper or the beat stands behind every wake-up)."""
    current_app.send_task(name, args=args, retry=False)


def wake_run(run_id: int) -> None:
    """Wake a worker for a run: called after commit (launch, approval) and by the
    sweeper. With the broker down the launch or decision still stands, and the sweeper
    sends the wake-up once the broker is back."""
    try:
        send(ADVANCE_RUN, (run_id,))
    except Exception as exc:  # noqa: BLE001 - any broker failure is the sweeper's job
        log.warning(
            "wake-up for run=%s not sent (%s: %s); the sweeper will pick the run up",
            run_id,
            type(exc).__name__,
            exc,
        )


def wake_delivery() -> None:
    """Ask a worker to deliver the outbox now, from this process's waker thread: the
    committing thread does not wait on the broker, and the wake-ups asked for while one
    is being sent (a hundred runs ending at once) cost one more. Never raises: a lost
    wake-up (the broker is down, the process exits first) is the beat's to cover."""
    _waker.ask()


def _send_delivery_wake() -> None:
    try:
        send(DELIVER_NOTIFICATIONS)
    except Exception as exc:  # noqa: BLE001 - any broker failure is the beat's job
        log.warning("delivery wake-up not sent (%s: %s); the beat will deliver", type(exc).__name__, exc)


# The least time between two delivery wake-ups from one process. A delivery task works
# through every undelivered event, so a wake-up per event is waste: a worker ending fifty
# runs a second spent about a millisecond of CPU sending each one, and then ran a
# delivery task for each. A lone event still goes out at once; events in a stream wait
# this long at most.
WAKE_INTERVAL_SECONDS = 0.1


class Waker:
    """One daemon thread per process that sends delivery wake-ups while any are asked
    for. Asks that arrive while a wake-up is on its way, or within WAKE_INTERVAL_SECONDS
    after it, fold into the next one."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._lock = threading.Lock()
        self._pid = 0  # the process whose thread runs (a forked child starts its own)

    def ask(self) -> None:
        self._asked.set()
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    threading.Thread(target=self._loop, name="airlock-wake", daemon=True).start()
                    self._pid = os.getpid()

    def _loop(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            _send_delivery_wake()
            time.sleep(WAKE_INTERVAL_SECONDS)


_waker = Waker()
