"""Argument conditions: the `when` of a rule (`{"arg", "op", "value"}`, `{"all": [...]}`,
`{"any": [...]}`), validated where a rule is saved and tested against a call's arguments.

The one place a condition's operators are defined; the policy (`policy.py`) matches
rules by them, and a fatigue draft (`drafts.py`) checks the rule it drafts with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import regex

OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in", "contains", "matches", "exists")
MAX_DEPTH = 8
MAX_PATTERN = 500


class PolicyError(ValueError):
    """A rule or policy that cannot be used; `field` names where (e.g. `rules[2].when.op`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def validate_condition(cond: Any, *, field: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise PolicyError(field, f"conditions nest at most {MAX_DEPTH} deep")
    if not isinstance(cond, dict):
        raise PolicyError(field, 'a condition is {"arg", "op", "value"}, {"all": [...]} or {"any": [...]}')
    for group in ("all", "any"):
        if group in cond:
            if set(cond) != {group}:
                raise PolicyError(field, f'"{group}" stands alone in its condition')
            items = cond[group]
            if not isinstance(items, list) or not items:
                raise PolicyError(f"{field}.{group}", "must be a non-empty list of conditions")
            for i, item in enumerate(items, 1):
                validate_condition(item, field=f"{field}.{group}[{i}]", depth=depth + 1)
            return
    unknown = sorted(set(cond) - {"arg", "op", "value"})
    if unknown:
        raise PolicyError(f"{field}.{unknown[0]}", 'unknown key (a condition takes arg, op and value)')
    path = cond.get("arg")
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise PolicyError(f"{field}.arg", "must be a dotted path into the arguments, e.g. order.total or items.0.sku")
    op = cond.get("op")
    if op not in OPS:
        raise PolicyError(f"{field}.op", f"must be one of {', '.join(OPS)}, not {op!r}")
    if op == "exists":
        if "value" in cond and not isinstance(cond["value"], bool):
            raise PolicyError(f"{field}.value", "exists takes true or false (default true)")
        return
    if "value" not in cond:
        raise PolicyError(f"{field}.value", f"{op} needs a value")
    value = cond["value"]
    if op in ("gt", "gte", "lt", "lte") and not (_number(value) or isinstance(value, str)):
        raise PolicyError(f"{field}.value", f"{op} compares with a number or a text")
    if op in ("in", "not_in") and not isinstance(value, list):
        raise PolicyError(f"{field}.value", f"{op} takes a list")
    if op == "matches":
        if not isinstance(value, str) or len(value) > MAX_PATTERN:
            raise PolicyError(f"{field}.value", f"matches takes a regular expression of at most {MAX_PATTERN} characters")
        try:
            regex.compile(value)
        except regex.RegexError as exc:
            raise PolicyError(f"{field}.value", f"not a valid regular expression: {exc}") from None


class Unevaluable(Exception):
    """A condition that cannot be evaluated on these arguments (type mismatch, bad regex)."""


def holds(cond: dict[str, Any], args: Any) -> bool:
    """Three-valued: True, False, or Unevaluable when the answer depends on a part that
    cannot be evaluated (so `any` with one true part is true, `all` with one false part
    is false, whatever the rest)."""
    if "all" in cond or "any" in cond:
        is_all = "all" in cond
        unknown = False
        for part in cond["all" if is_all else "any"]:
            try:
                value = holds(part, args)
            except Unevaluable:
                unknown = True
                continue
            if value != is_all:
                return value
        if unknown:
            raise Unevaluable("part of the condition cannot be evaluated")
        return is_all
    op = cond["op"]
    found = resolve(args, cond["arg"].split("."))
    if op == "exists":
        return bool(found) is bool(cond.get("value", True))
    # .get: a run's snapshot drops nulls, so `"value": null` arrives as no value.
    return _any(found, lambda actual: _test(op, actual, cond.get("value")), fan_out=op != "contains")


def resolve(value: Any, parts: list[str]) -> list[Any]:
    """Every value the dotted path reaches; a list met on the way fans out over its
    elements unless the next part is an index into it. Empty when the path is absent."""
    if not parts:
        return [value]
    head, rest = parts[0], parts[1:]
    if isinstance(value, dict):
        return resolve(value[head], rest) if head in value else []
    if isinstance(value, list):
        if head.isdigit():
            i = int(head)
            return resolve(value[i], rest) if i < len(value) else []
        return [found for element in value for found in resolve(element, parts)]
    return []


def _any(found: list[Any], test: Callable[[Any], bool], *, fan_out: bool) -> bool:
    """True if the test holds for any value (or any element of a list value)."""
    candidates: list[Any] = []
    for value in found:
        if fan_out and isinstance(value, list):
            candidates.extend(value)
        else:
            candidates.append(value)
    unknown = False
    for actual in candidates:
        try:
            if test(actual):
                return True
        except Unevaluable:
            unknown = True
    if unknown:
        raise Unevaluable("cannot be evaluated on these arguments")
    return False


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(a: Any, b: Any) -> bool:
    # JSON true is not 1: a rule on a flag must not match a count.
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def _test(op: str, actual: Any, value: Any) -> bool:
    if op == "eq":
        return _same(actual, value)
    if op == "ne":
        return not _same(actual, value)
    if op in ("in", "not_in"):
        if not isinstance(value, list):
            raise Unevaluable(f"{op} needs a list")
        inside = any(_same(actual, v) for v in value)
        return inside if op == "in" else not inside
    if op in ("gt", "gte", "lt", "lte"):
        if not ((_number(actual) and _number(value)) or (isinstance(actual, str) and isinstance(value, str))):
            raise Unevaluable(f"cannot compare {type(actual).__name__} with {type(value).__name__}")
        if op == "gt":
            return bool(actual > value)
        if op == "gte":
            return bool(actual >= value)
        if op == "lt":
            return bool(actual < value)
        return bool(actual <= value)
    if op == "contains":
        if isinstance(actual, str) and isinstance(value, str):
            return value in actual
        if isinstance(actual, list):
            return any(_same(element, value) for element in actual)
        if isinstance(actual, dict) and isinstance(value, str):
            return value in actual
        raise Unevaluable(f"{type(actual).__name__} cannot contain {type(value).__name__}")
    if op == "matches":
        if not isinstance(actual, str) or not isinstance(value, str):
            raise Unevaluable("matches needs text")
        try:
            # RE2, linear time: a rule's pattern cannot stall the worker (engine/regex.py).
            return regex.search(value, actual)
        except regex.RegexError as exc:
            raise Unevaluable(str(exc)) from None
    raise Unevaluable(f"unknown op {op!r}")
