"""History rules: a rule that also looks at the calls made before this one.

A rule's `history` object (docs/policy.md, "Rules that remember") adds a condition on
what already happened in a scope: how many counted calls (`calls_over`), the sum of an
argument over them (`sum_over`), or whether a call of some tool ran earlier (`after`).
This module is pure: it validates the object, turns it into a `Query` for one proposed
call, and judges the `Figures` a query answered. The queries that produce the figures
live outside the engine (agents/runs/history.py), behind the `History` protocol.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

SCOPES = ("run", "caller", "profile", "project")
KEYS = frozenset({"within", "scope", "same", "calls_over", "sum_over", "after", "of"})
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = 366 * 86400  # a year: a longer window is a typo, not a policy
MAX_PATHS = 8
MAX_TOOLS = 50
MAX_CALLS = 1_000_000
_DURATION = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
# json.dumps(value, sort_keys=True, separators=(",", ":")) without a new encoder per call
# (json.dumps builds one whenever it is given options): asked of every history rule of
# every proposal.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode


class HistoryError(ValueError):
    """A history object that cannot be used; `field` is relative to the rule (e.g. `history.within`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@functools.lru_cache(maxsize=256)
def seconds(within: str) -> int:
    """'90s' -> 90, '15m' -> 900, '24h' -> 86400, '7d' -> 604800."""
    m = _DURATION.match(within)
    if m is None:
        raise ValueError(f"not a duration: {within!r}")
    return int(m.group(1)) * UNITS[m.group(2)]


def validate(history: Any, *, field: str = "history") -> dict[str, Any]:
    """The history object as plain data, or HistoryError naming the first bad field."""
    if not isinstance(history, dict):
        raise HistoryError(field, "must be an object with scope and one of calls_over, sum_over or after")
    unknown = sorted(set(history) - KEYS)
    if unknown:
        raise HistoryError(f"{field}.{unknown[0]}", f"unknown key (history takes {', '.join(sorted(KEYS))})")
    scope = history.get("scope")
    if scope not in SCOPES:
        raise HistoryError(f"{field}.scope", f"must be one of {', '.join(SCOPES)}, not {scope!r}")
    clean: dict[str, Any] = {"scope": scope}
    if "within" in history:
        within = history["within"]
        if not isinstance(within, str) or _DURATION.match(within) is None:
            raise HistoryError(f"{field}.within", 'must be a duration such as "90s", "15m", "1h", "24h" or "7d"')
        if seconds(within) > MAX_WINDOW:
            raise HistoryError(f"{field}.within", "at most 366d")
        clean["within"] = within
    elif scope != "run":
        raise HistoryError(f"{field}.within", f'a {scope} scope needs a window ("24h", "7d", ...); only a run scope may leave it out')
    tests = [k for k in ("calls_over", "sum_over", "after") if k in history]
    if len(tests) != 1:
        raise HistoryError(field, "takes exactly one of calls_over, sum_over or after")
    if "same" in history:
        same = history["same"]
        if not isinstance(same, list) or not same or len(same) > MAX_PATHS:
            raise HistoryError(f"{field}.same", f"must be a list of 1 to {MAX_PATHS} argument paths")
        for i, path in enumerate(same, 1):
            _check_path(path, f"{field}.same[{i}]")
        clean["same"] = list(same)
    if "calls_over" in history:
        n = history["calls_over"]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_CALLS:
            raise HistoryError(f"{field}.calls_over", f"must be a whole number from 0 to {MAX_CALLS}")
        clean["calls_over"] = n
    if "sum_over" in history:
        sums = history["sum_over"]
        if not isinstance(sums, dict) or len(sums) != 1:
            raise HistoryError(f"{field}.sum_over", 'must be one {"path": number}, e.g. {"amount": 500}')
        ((path, limit),) = sums.items()
        _check_path(path, f"{field}.sum_over")
        if not _number(limit):
            raise HistoryError(f"{field}.sum_over.{path}", "must be a number")
        clean["sum_over"] = {path: limit}
    for key in ("after", "of"):
        if key in history:
            names = history[key]
            if not isinstance(names, list) or not names or len(names) > MAX_TOOLS:
                raise HistoryError(f"{field}.{key}", f"must be a list of 1 to {MAX_TOOLS} tool names")
            for i, name in enumerate(names, 1):
                if not isinstance(name, str) or not name.strip() or name == "*" or "*" in name[:-1] or (
                    name.endswith("*") and not name.endswith("__*")
                ):
                    raise HistoryError(f"{field}.{key}[{i}]", "must be a tool name or NAME__* (all of an MCP server's tools)")
            clean[key] = list(names)
    return clean


def _check_path(path: Any, field: str) -> None:
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise HistoryError(field, "must be a dotted path into the arguments, e.g. order_id or customer.id")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- a query for one proposed call ---------------------------------------------------


@dataclass(frozen=True)
class Query:
    """What a history rule asks about one proposed call: the calls in `scope` over the
    last `window` seconds (None: the whole run) of `tools` (names or `NAME__*`; empty:
    every tool) whose arguments at each `same` path equal `equal`'s value.

    `count_to`: count calls up to this many (a `calls_over` needs no more); `sum_path`:
    also sum this argument; `ran`: only whether a call of `tools` ran (an `after`).
    """

    scope: str
    window: int | None
    tools: tuple[str, ...]
    same: tuple[tuple[str, str], ...] = ()  # (path, canonical JSON of this call's value)
    count_to: int | None = None
    sum_path: str | None = None
    ran: bool = False

    def lock_key(self) -> int | None:
        """The 63-bit number that serialises judgements counting the same calls (an
        advisory lock on PostgreSQL), or None when the run's own lock suffices (a run
        judges one call at a time). The window and the test are left out: two rules
        over the same calls share one lock."""
        if self.scope == "run":
            return None
        text = _COMPACT([self.scope, sorted(self.tools), self.same])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1

    def same_values(self) -> dict[str, Any]:
        return {path: json.loads(value) for path, value in self.same}


@dataclass(frozen=True)
class Figures:
    """What a query found: `count` counted calls (at most the query's `count_to`),
    `total` the sum of its `sum_path` over them, `ran` the tool of a call that ran."""

    count: int = 0
    total: float = 0
    ran: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "total": self.total, "ran": self.ran}


class History(Protocol):
    """Answers history queries for one run (its scope's ids are the provider's)."""

    def figures(self, queries: Sequence[Query]) -> list[Figures]: ...


Answer = Callable[[Sequence[Query]], list[Figures]]


class Unevaluable(Exception):
    """The history condition cannot be evaluated (no value at a `same` or `sum_over`
    path in this call, no history to read): the rule fails closed."""


def value_at(args: Any, path: str) -> tuple[bool, Any]:
    """(found, value) at a dotted path, read as PostgreSQL's `#>` reads it: a number
    indexes a list, nothing fans out."""
    value = args
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def query_for(rule: dict[str, Any], tool: str, args: Any) -> Query:
    """The query a rule's history asks about this call (Unevaluable: it cannot ask)."""
    h = rule["history"]
    same = []
    for path in h.get("same", ()):
        found, value = value_at(args, path)
        if not found or value is None:
            raise Unevaluable(f"the call has no {path}")
        same.append((path, _CANONICAL(value)))
    if "after" in h:
        tools = tuple(h["after"])
    elif "of" in h:
        tools = tuple(h["of"])
    else:
        tools = () if rule["tool"] == "*" else (rule["tool"],)
    window = seconds(h["within"]) if "within" in h else None
    count_to = h.get("calls_over")
    sum_path = next(iter(h["sum_over"])) if "sum_over" in h else None
    if sum_path is not None:
        found, value = value_at(args, sum_path)
        if not found or not _number(value):
            raise Unevaluable(f"the call has no number at {sum_path}")
    return Query(
        scope=h["scope"], window=window, tools=tools, same=tuple(same),
        count_to=count_to if count_to is None else count_to + 1, sum_path=sum_path, ran="after" in h,
    )


def holds(rule: dict[str, Any], args: Any, figures: Figures) -> bool:
    """Whether the rule's history condition holds for this call, given its figures.

    `calls_over: N` catches the (N+1)-th counted call: N earlier ones exist.
    `sum_over: {PATH: X}`: the earlier calls' sum plus this call's value exceeds X.
    `after`: a call of one of the tools ran earlier."""
    h = rule["history"]
    if "calls_over" in h:
        return figures.count >= int(h["calls_over"])
    if "sum_over" in h:
        ((path, limit),) = h["sum_over"].items()
        _, value = value_at(args, path)
        return bool(figures.total + value > limit)
    return figures.ran is not None


def matches(tool: str, patterns: Sequence[str]) -> bool:
    """A tool name against names and `NAME__*` patterns; no patterns: every tool."""
    if not patterns:
        return True
    return any(tool == p or (p.endswith("__*") and tool.startswith(p[:-1])) for p in patterns)


# -- what the reviewer reads -----------------------------------------------------------


def ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _amount(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.2f}"


def _span(h: dict[str, Any]) -> str:
    within = h.get("within")
    if within is None:
        return "in this run"
    m = _DURATION.match(within)
    assert m is not None
    scope = {"run": " in this run", "caller": " by this caller", "profile": "", "project": " in this project"}[h["scope"]]
    return f"in {m.group(1)} {m.group(2)}{scope}"


@dataclass(frozen=True)
class Reading:
    """A history rule's figures as the reviewer sees them (approval JSON `history`)."""

    scope: str
    within: str | None
    tools: list[str]
    same: dict[str, Any]
    text: str
    count: int | None = None
    calls_over: int | None = None
    total: float | None = None
    sum_over: float | None = None
    ran: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # Every key, null where the rule's test does not use it (as the API shows it).
        return {
            "scope": self.scope, "within": self.within, "tools": self.tools, "same": self.same,
            "count": self.count, "calls_over": self.calls_over, "total": self.total, "sum_over": self.sum_over,
            "ran": self.ran, "text": self.text,
        }


def reading(rule: dict[str, Any], tool: str, args: Any, query: Query, figures: Figures) -> Reading:
    """'3rd refund of order_id 1042 in 24 h', '36.00 refunded ... over 30': the figures
    in numbers, for the card, the approval page, Slack and email."""
    h = rule["history"]
    same = query.same_values()
    of = " with " + ", ".join(f"{p} {_show(v)}" for p, v in same.items()) if same else ""
    span = _span(h)
    tools = list(query.tools)
    what = tool if not h.get("of") else "/".join(h["of"])
    base = {"scope": h["scope"], "within": h.get("within"), "tools": tools, "same": same}
    if "calls_over" in h:
        n = figures.count + 1  # this call is the next one
        capped = query.count_to is not None and figures.count >= query.count_to
        nth = f"at least the {ordinal(n)}" if capped else f"the {ordinal(n)}"
        if h.get("of"):
            text = f"{figures.count}{'+' if capped else ''} earlier {what} call(s){of} {span} (over {h['calls_over']})"
        else:
            text = f"{nth} {tool + ' ' if query.tools else ''}call{of} {span} (over {h['calls_over']})"
        return Reading(**base, text=text, count=figures.count, calls_over=h["calls_over"])
    if "sum_over" in h:
        ((path, limit),) = h["sum_over"].items()
        _, value = value_at(args, path)
        total = figures.total + value
        text = f"{_amount(total)} {path} in {what} calls{of} {span}, this one included (over {_amount(limit)})"
        return Reading(**base, text=text, total=total, sum_over=limit)
    ran = figures.ran
    text = f"after {ran} ran {span}" if ran else f"no call of {', '.join(h['after'])} ran {span}"
    return Reading(**base, text=text, ran=ran)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
