"""Named crash points for fault-injection tests.

`AIRLOCK_CRASH_AT=after_intent_commit` (comma-separated for several) makes the process
exit at once when it reaches that point, as a SIGKILL would. Tests running in-process
set `MODE = "raise"` to get a SimulatedCrash instead. Off by default: one set lookup.
"""

from __future__ import annotations

import os
from typing import Any

from agents.engine.registry import ToolContext, ToolSpec

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


# -- fault tools ----------------------------------------------------------------------
# Registered only when AIRLOCK_FAULT_TOOLS=1 (the reliability tests' worker processes):
# `crash` kills the process running it, every time (a poison run); `hostile` returns a
# 10 MB text, NUL bytes or invalid UTF-8, as a misbehaving real tool might.
FAULT_TOOLS_ON = os.environ.get("AIRLOCK_FAULT_TOOLS", "") == "1"
TEN_MB = 10 * 1024 * 1024


def _crash(args: dict[str, Any], ctx: ToolContext) -> None:
    os._exit(71)


def _hostile(args: dict[str, Any], ctx: ToolContext) -> Any:
    kind = args["kind"]
    if kind == "huge":
        return "A" * TEN_MB
    if kind == "nul":
        return "before\x00after"
    if kind == "bad_utf8":
        return b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")
    return {"nested": ["\x00", b"\xff".decode("utf-8", "surrogateescape")]}


def fault_tools() -> list[ToolSpec]:
    kind = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}
    return [
        ToolSpec(
            "crash", "Exits its process at once (fault tests).", {"type": "object"}, "read", "internal", "safe", _crash
        ),
        ToolSpec("hostile", "Returns hostile output (fault tests).", kind, "read", "internal", "safe", _hostile),
    ]
