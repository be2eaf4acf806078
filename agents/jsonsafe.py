"""The one JSON parser for every door: the API's bodies, the launch and review forms, MCP
results and model-proposed arguments.

Python's `json` accepts what PostgreSQL's jsonb refuses or what breaks further down:
NaN and Infinity (and `1e400`, which overflows to infinity), lone surrogates such as
`"\\ud800"` (in keys too), and nesting deep enough to raise RecursionError in the
decoder or in pydantic's serializer. A value that got in was a 500 when its row was
written (issue 34, item 7). `parse()` refuses all of these before anything is written,
and `validate()` checks data some other parser already decoded (an MCP result, a
model's tool call), each with a `JsonError` whose message names the problem and where.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64  # levels of arrays and objects; pydantic's serializer gives up past ~250
MAX_CHARS = 1_000_000  # characters of JSON text one document may have


class JsonError(ValueError):
    """Refused JSON; `problem` is one of `invalid`, `non_finite`, `too_deep`,
    `too_large`, `invalid_unicode`, and the message names it (and where)."""

    def __init__(self, problem: str, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


class _Literal(float):
    """A non-finite number as the document spelled it, so the error can quote it."""

    text: str


def _literal(text: str) -> float:
    value = float(text)
    if math.isfinite(value):
        return value
    # Kept as a marker and refused by validate(), which knows where it sits.
    marker = _Literal(value)
    marker.text = text if len(text) <= 40 else text[:37] + "..."
    return marker


# A JSON string (escapes included), and everything that is not a bracket: removing both
# leaves the brackets, whose running count is the nesting depth. Both are C-speed passes.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _depth(text: str) -> int:
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse(text: str | bytes, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS) -> Any:
    """The JSON value of `text` (bytes must be UTF-8), or a JsonError naming why not."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonError("invalid_unicode", f"the body is not UTF-8 (byte {exc.start})") from None
    if len(text) > max_chars:
        raise JsonError("too_large", f"the JSON is over {max_chars:,} characters ({len(text):,})")
    if _depth(text) > max_depth:
        raise JsonError("too_deep", f"the JSON is nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_float=_literal, parse_constant=_literal)
    except json.JSONDecodeError as exc:
        raise JsonError("invalid", f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:  # the pre-count makes this unreachable; kept as the last word
        raise JsonError("too_deep", f"the JSON is nested deeper than {max_depth} levels") from None
    except ValueError:  # an integer past Python's int_max_str_digits
        raise JsonError("too_large", "an integer with more than 4,300 digits") from None
    return validate(value, max_depth=max_depth)


def _where(path: list[Any]) -> str:
    out = "$"
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}" if re.fullmatch(r"\w{1,40}", p) else f"[{json.dumps(p[:40])}]"
    return out if len(out) <= 200 else out[:100] + "…" + out[-99:]


def _bad_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def validate(value: Any, *, max_depth: int = MAX_DEPTH, max_chars: int | None = None) -> Any:
    """`value` itself if it is plain JSON PostgreSQL can store: dicts with text keys,
    lists, text, finite numbers, booleans and null, at most `max_depth` levels deep
    (and, with `max_chars`, at most that many characters of text in all); otherwise a
    JsonError naming the problem and its place (`$.script[0].final`).

    Walked with a stack, not recursion: data some other parser decoded may be deeper
    than Python's recursion limit."""
    total = 0
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _bad_text(item):
                raise JsonError("invalid_unicode", f"text with a lone surrogate (invalid Unicode) at {_where(path)}")
            total += len(item)
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            pass
        elif isinstance(item, float):
            if not math.isfinite(item):
                shown = item.text if isinstance(item, _Literal) else repr(item)
                raise JsonError("non_finite", f"{shown} at {_where(path)} is not a finite number")
        elif isinstance(item, (dict, list, tuple)):
            if len(path) >= max_depth:
                raise JsonError("too_deep", f"the JSON is nested deeper than {max_depth} levels (at {_where(path)})")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise JsonError("invalid", f"a key that is not text at {_where(path)}")
                    if _bad_text(key):
                        raise JsonError("invalid_unicode", f"a key with a lone surrogate (invalid Unicode) at {_where(path)}")
                    total += len(key)
                    stack.append((child, [*path, key]))
            else:
                stack.extend((child, [*path, i]) for i, child in enumerate(item))
        else:
            raise JsonError("invalid", f"a {type(item).__name__} at {_where(path)} is not JSON")
        if max_chars is not None and total > max_chars:
            raise JsonError("too_large", f"the value holds over {max_chars:,} characters of text")
    return value
