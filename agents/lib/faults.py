"""Named crash points for fault-injection tests (the tools that misbehave on purpose,
`crash` and `hostile`, live with the tests: tests/reliability/fault_tools.py).

`AIRLOCK_CRASH_AT=after_intent_commit` (comma-separated for several) makes the process
exit at once when it reaches that point, as a SIGKILL would. Tests running in-process
set `MODE = "raise"` to get a SimulatedCrash instead. Off by default: one set lookup.
"""

from __future__ import annotations

import os

from config.env import EnvError, env_list, env_str

POINTS = frozenset(
    {
        "before_intent_commit",  # the transition into acting is about to commit
        "after_intent_commit",  # the intent is committed, the tool has not run
        "after_tool_before_result_commit",  # the tool returned, its result is not saved
        "after_transition_commit",  # a transition committed, the broker not yet acked
        "after_launch_commit",  # a launch committed, advance_run not yet enqueued
    }
)
CRASH_AT = frozenset(env_list("AIRLOCK_CRASH_AT", []))
MODE = env_str("AIRLOCK_CRASH_MODE", "exit")

unknown = CRASH_AT - POINTS
if unknown:
    raise EnvError(f"AIRLOCK_CRASH_AT names unknown crash points: {sorted(unknown)}; known: {sorted(POINTS)}")
if MODE not in ("exit", "raise"):
    raise EnvError(f"AIRLOCK_CRASH_MODE must be exit or raise, not {MODE!r}")


class SimulatedCrash(BaseException):
    """Raised instead of exiting when MODE is "raise"; nothing in Airlock catches it."""


def crash_point(name: str) -> None:
    if name in CRASH_AT:
        if MODE == "raise":
            raise SimulatedCrash(name)
        os._exit(70)
