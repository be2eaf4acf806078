"""Celery tasks, thin shells: the work is in `agents.runs.worker`, `agents.runs.sweeper`
and `agents.notifications.delivery`; the wake-ups that enqueue them, by name, in
`agents.broker`.

The database is the truth and broker messages are only wake-ups: a duplicate delivery
finds the run leased or already advanced and does nothing, a lost one is replaced by
the sweeper.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from agents.notifications import delivery, slack
from agents.runs import retention, sweeper, worker


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def advance_run(self: Any, run_id: int) -> None:
    """Drive one run for a bounded number of transitions (`agents.runs.worker.advance`)."""
    worker.advance(run_id, redelivered=bool((self.request.delivery_info or {}).get("redelivered")))


@shared_task(ignore_result=True)
def sweep() -> dict[str, int]:
    """Find the runs nobody is advancing (`agents.runs.sweeper.sweep`)."""
    return sweeper.sweep()


@shared_task(ignore_result=True)
def deliver_notifications() -> dict[str, int]:
    """Fan out new outbox events, attempt the due webhook deliveries, send a due digest.

    Woken after a commit that wrote events and run by the beat (retries wait there, not
    in the broker). Safe with any number at once; see `agents.notifications.delivery`.
    """
    done = delivery.dispatch()
    # Slack messages of calls decided elsewhere say so (through a click's response_url).
    done["slack_updated"] = slack.update_decided()
    return done


@shared_task(ignore_result=True)
def purge_runs() -> dict[str, int]:
    """The daily purge of finished runs past their retention (`agents.runs.retention`)."""
    report = retention.purge(actor="schedule")
    return {"runs": report.runs, "bytes": report.bytes}
