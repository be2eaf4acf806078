"""Diagnostic tools (registered when AIRLOCK_ALLOW_SCRIPTED is on): how tests and evals
provoke every path of the engine and count side effects in the ledger."""

from __future__ import annotations

import time
from typing import Any

from agents.engine.registry import ToolContext, ToolSpec
from agents.models import LedgerEntry

TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": False}
ENTRY = {"type": "object", "properties": {"entry": {}}, "required": ["entry"], "additionalProperties": False}


def echo(args: dict[str, Any], ctx: ToolContext) -> str:
    return args["text"]  # type: ignore[no-any-return]


def fail(args: dict[str, Any], ctx: ToolContext) -> None:
    raise RuntimeError("the fail tool always fails")


def sleep(args: dict[str, Any], ctx: ToolContext) -> str:
    time.sleep(args["seconds"])
    return f"slept {args['seconds']} s"


def ledger_write(args: dict[str, Any], ctx: ToolContext) -> str:
    # Deduplicates on the idempotency key: a repeat of the same call records nothing.
    LedgerEntry.objects.bulk_create(
        [LedgerEntry(run_id=int(ctx.run_id), idempotency_key=ctx.idempotency_key, entry=args["entry"])],
        ignore_conflicts=True,
    )
    return "recorded"


def ledger_write_unsafe(args: dict[str, Any], ctx: ToolContext) -> str:
    LedgerEntry.objects.create(run_id=int(ctx.run_id), idempotency_key=None, entry=args["entry"])
    return "recorded"


TOOLS = [
    ToolSpec("echo", "Returns the given text.", TEXT, "read", "internal", "safe", echo),
    ToolSpec("fail", "Always raises an error.", {"type": "object"}, "read", "internal", "safe", fail),
    ToolSpec(
        "sleep",
        "Waits the given number of seconds.",
        {"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 600}},
         "required": ["seconds"], "additionalProperties": False},
        "read", "internal", "safe", sleep, timeout=610,
    ),
    ToolSpec("fetch_fixture", "Returns the given text as if fetched from a web page.", TEXT, "read", "external", "safe", echo),
    ToolSpec("ledger_write", "Records one ledger entry per idempotency key.", ENTRY, "write", "internal", "safe", ledger_write),
    ToolSpec("ledger_write_unsafe", "Records a ledger entry every time it runs.", ENTRY, "write", "internal", "unsafe", ledger_write_unsafe),
]
