"""Named crash points for fault-injection tests.

`AIRLOCK_CRASH_AT=after_intent_commit` (comma-separated for several) makes the process
exit at once when it reaches that point, as a SIGKILL would. Tests running in-process
set `MODE = "raise"` to get a SimulatedCrash instead. Off by default: one set lookup.
"""

from __future__ import annotations

import os

POINTS = frozenset(
    {
        "before_intent_commit",  # the transition into acting is about to commit
        "after_intent_commit",  # the intent is committed, the tool has not run
        "after_tool_before_result_commit",  # the tool returned, its result is not saved
        "after_transition_commit",  # a transition committed, the broker not yet acked
        "after_launch_commit",  # a launch committed, advance_run not yet enqueued
    }
)
CRASH_AT: frozenset[str] = frozenset(p for p in os.environ.get("AIRLOCK_CRASH_AT", "").split(",") if p)
MODE = os.environ.get("AIRLOCK_CRASH_MODE", "exit")

unknown = CRASH_AT - POINTS
if unknown:
    raise ValueError(f"AIRLOCK_CRASH_AT names unknown crash points: {sorted(unknown)}; known: {sorted(POINTS)}")


class SimulatedCrash(BaseException):
    """Raised instead of exiting when MODE is "raise"; nothing in Airlock catches it."""


def crash_point(name: str) -> None:
    if name in CRASH_AT:
        if MODE == "raise":
            raise SimulatedCrash(name)
        os._exit(70)
