"""What the journal and the transcript may hold: text PostgreSQL can store (no NUL
bytes) and results bounded to the journal's size."""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings


def clean(value: Any) -> Any:
    """NUL bytes and lone surrogates (invalid UTF-8) replaced, and NaN and infinities
    (which jsonb refuses) written as text ("nan", "inf"), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {clean(str(k)): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return clean(str(value))


def clean_json(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`clean(value)` with its JSON text. The text is checked first: the engine state
    is almost always clean, and one json.dumps costs less than walking it."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # a NaN takes the walk below
    except (TypeError, ValueError):
        text = None
    if text is not None and "\\u0000" not in text:  # json.dumps escapes NUL
        try:
            text.encode("utf-8")  # a lone surrogate cannot be encoded
            return value, text
        except UnicodeEncodeError:
            pass
    value = clean(value)
    return value, json.dumps(value, ensure_ascii=False)


def bounded_result(result: Any) -> tuple[Any, int, bool]:
    """The journal keeps up to AIRLOCK_JOURNAL_MAX_CHARS of a result's JSON."""
    result = clean(result)
    text = json.dumps(result, ensure_ascii=False)
    limit = settings.AIRLOCK_JOURNAL_MAX_CHARS
    if len(text) <= limit:
        return result, len(text), False
    ok = bool(isinstance(result, dict) and result.get("ok"))
    kept = {"ok": ok, "truncated": True, "result_json_prefix": text[:limit]}
    return kept, len(text), True
