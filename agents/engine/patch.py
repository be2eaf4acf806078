"""JSON merge patches (RFC 7396) between engine states.

A transition stores only what it changed, so replaying a run's transitions rebuilds its
cached state and storage grows linearly with steps. Engine JSON never holds null values
(they are dropped), which keeps merge patches exact.
"""

from __future__ import annotations

from typing import Any


def compact(value: Any) -> Any:
    """Drop None values from dicts, recursively."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        out[key] = None
    for key, value in new.items():
        before = old.get(key)
        if before == value and key in old:
            continue
        if isinstance(before, dict) and isinstance(value, dict):
            out[key] = diff(before, value)
        else:
            out[key] = value
    return out


def apply(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply(out[key], value)
        else:
            out[key] = compact(value)
    return out
