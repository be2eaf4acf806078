"""Helpers for the whole suite: personas, script items, clients, waiting and racing.

Fixtures live in tests/conftest.py; everything a test imports comes from here, never
from a conftest module.
"""

from __future__ import annotations

from typing import Any


def call(tool: str, usage: dict[str, int] | None = None, **args: Any) -> dict[str, Any]:
    """A scripted model decision: call `tool` with `args`."""
    item: dict[str, Any] = {"call": {"tool": tool, "args": args}}
    if usage:
        item["usage"] = usage
    return item


def final(text: str = "done", usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A scripted model decision: the final answer."""
    item: dict[str, Any] = {"final": text}
    if usage:
        item["usage"] = usage
    return item
