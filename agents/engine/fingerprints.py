"""Canonical JSON, call fingerprints and idempotency keys."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# One encoder for every call: json.dumps builds a new one whenever it is given options,
# and a proposal asks this three times (fingerprint, idempotency key, arguments' hash).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, non-ASCII kept: equal values give equal text."""
    return _CANONICAL(value)


def fingerprint(tool: str, args: Any) -> str:
    """Identifies "the same call" across a run, whatever the step."""
    return hashlib.sha256(f"{tool}:{canonical_json(args)}".encode()).hexdigest()[:32]


def idempotency_key(run_id: str | int, step: int, tool: str, args: Any) -> str:
    """sha256 of `run_id : step : tool : canonical args`, as the design fixes it."""
    raw = f"{run_id}:{step}:{tool}:{canonical_json(args)}"
    return hashlib.sha256(raw.encode()).hexdigest()


def args_hash(args: Any) -> str:
    """sha256 (hex) of the canonical JSON of a call's arguments: what a decision names
    to say which call its voter saw (docs/api.md, `args_hash`)."""
    return hashlib.sha256(canonical_json(args).encode()).hexdigest()
