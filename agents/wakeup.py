"""Waking a worker for a run: a hint, never the truth.

Called after commit (launch, approval) and by the sweeper. It never raises into the
caller: with the broker down the launch or decision still stands, and the sweeper
sends the wake-up once the broker is back.
"""

from __future__ import annotations

import logging

log = logging.getLogger("airlock.wakeup")


def wake(run_id: int) -> None:
    from agents.tasks import advance_run

    try:
        # No retry loop here: this runs inside a web request's on_commit hook.
        advance_run.apply_async((run_id,), retry=False)
    except Exception as exc:  # noqa: BLE001 - any broker failure is the sweeper's job
        log.warning(
            "wake-up for run=%s not sent (%s: %s); the sweeper will pick the run up",
            run_id,
            type(exc).__name__,
            exc,
        )
