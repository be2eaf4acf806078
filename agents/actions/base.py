"""What every action shares: the refusal they raise, the actor a transition records,
the worker's wake-up once the rows are committed."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agents import broker


class ActionError(Exception):
    """A refused action, with a short machine code and a readable detail."""

    def __init__(self, code: str, detail: Any, *, status: int = 400) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status


def actor_name(user: Any) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


def wake_after_commit(run_id: int) -> None:
    # Wake a worker once the rows are visible; the sweeper covers a lost wake-up.
    transaction.on_commit(lambda: broker.wake_run(run_id))
