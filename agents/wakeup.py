"""Waking a worker for a run. Until the Celery workers land, nothing listens: runs are
advanced by the synchronous driver (`store.drive`)."""

from __future__ import annotations


def wake(run_id: int) -> None:
    return None
