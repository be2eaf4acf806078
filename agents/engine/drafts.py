"""A draft of a narrower allow rule, from calls reviewers approved unchanged.

Approval fatigue (docs/reviewing.md): when one rule's calls were approved as proposed
many times in a row, the stats page offers this draft for an operator to review, try as
a shadow rule and backtest. It is data, never applied by anything: the draft allows only
calls whose arguments stay inside what was seen (numbers between the smallest and the
largest, texts and booleans among the few values seen), and a key whose values cannot be
bounded that way is left out of the rule rather than guessed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import policy
from .conditions import holds

MAX_CHOICES = 10  # more distinct texts than this and a key is not bounded by `in`
MAX_CONDITIONS = 8
MAX_DEPTH = 3  # nested objects are followed this deep (`order.total`)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _paths(args: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    for key in sorted(args):
        if not isinstance(key, str) or not key or "." in key:
            continue
        value = args[key]
        if isinstance(value, dict) and depth + 1 < MAX_DEPTH:
            yield from _paths(value, f"{prefix}{key}.", depth + 1)
        else:
            yield f"{prefix}{key}", value


def _bound(path: str, values: list[Any]) -> list[dict[str, Any]]:
    """The conditions that hold for every value seen at `path`, or [] when none bounds it."""
    if all(_number(v) for v in values):
        low, high = min(values), max(values)
        if low == high:
            return [{"arg": path, "op": "eq", "value": low}]
        return [{"arg": path, "op": "gte", "value": low}, {"arg": path, "op": "lte", "value": high}]
    if all(isinstance(v, str) for v in values) or all(isinstance(v, bool) for v in values):
        seen = sorted(set(values))
        if len(seen) == 1:
            return [{"arg": path, "op": "eq", "value": seen[0]}]
        if len(seen) <= MAX_CHOICES:
            return [{"arg": path, "op": "in", "value": seen}]
    return []


def narrower_allow(tool: str, calls: Sequence[Any], *, reason: str) -> dict[str, Any] | None:
    """An allow rule for `tool` (in shadow mode) that every one of `calls` (their
    arguments) satisfies, bounded by the values they had; None when no argument can be
    bounded (a rule without a condition would allow every call of the tool)."""
    objects = [c for c in calls if isinstance(c, dict)]
    if not objects or len(objects) != len(calls):
        return None
    seen: dict[str, list[Any]] = {}
    for args in objects:
        for path, value in _paths(args):
            seen.setdefault(path, []).append(value)
    conditions: list[dict[str, Any]] = []
    for path, values in seen.items():
        if len(values) == len(objects):  # only keys every call had: a missing one is no bound
            conditions.extend(_bound(path, values))
    conditions = conditions[:MAX_CONDITIONS]
    if not conditions:
        return None
    when = conditions[0] if len(conditions) == 1 else {"all": conditions}
    draft = {"tool": tool, "when": when, "then": "allow", "reason": reason, "mode": policy.SHADOW}
    # The one validator: a draft the admin would refuse is never offered.
    clean = policy.validate_rule(draft, field="draft")
    assert all(holds(when, args) for args in objects), "a draft must allow the calls it came from"
    return clean
