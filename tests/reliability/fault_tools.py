"""Tools that misbehave on purpose, for the reliability tests' worker processes, which
start with AIRLOCK_EXTRA_TOOLS=tests.reliability.fault_tools: `crash` kills the process
running it, every time (a poison run); `hostile` returns a 10 MB text, NUL bytes or
invalid UTF-8, as a misbehaving real tool might (or, `tool_threads`, the number of
the worker's live tool threads)."""

from __future__ import annotations

import os
import threading
from typing import Any

from agents.engine.registry import ToolContext, ToolSpec

TEN_MB = 10 * 1024 * 1024


def _crash(args: dict[str, Any], ctx: ToolContext) -> None:
    os._exit(71)


def _hostile(args: dict[str, Any], ctx: ToolContext) -> Any:
    kind = args["kind"]
    if kind == "tool_threads":  # not hostile: how many tool threads this process has alive
        return sum(1 for t in threading.enumerate() if t.name == "airlock-tool" and t.is_alive())
    if kind == "huge":
        return "A" * TEN_MB
    if kind == "nul":
        return "before\x00after"
    if kind == "bad_utf8":
        return b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")
    return {"nested": ["\x00", b"\xff".decode("utf-8", "surrogateescape")]}


KIND = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}
TOOLS = [
    ToolSpec("crash", "Exits its process at once (fault tests).", {"type": "object"}, "read", "internal", "safe", _crash),
    ToolSpec("hostile", "Returns hostile output (fault tests).", KIND, "read", "internal", "safe", _hostile),
]
