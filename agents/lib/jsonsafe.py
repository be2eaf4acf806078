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
# leaves the brackets, whose running count is the nesting depth. Both are C-speed passes,
# linear: the quantifiers are possessive, and a string that never ends takes the rest of
# the text at once (else the search would start again at each escaped quote in it, and
# '"' + '\\"' * 30_000 took 28 s).
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|"[\s\S]*', re.S)
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


def _where(node: Any, key: Any = None) -> str:
    """The JSONPath of `node` (a `(parent, key)` chain, None at the top), then `key`."""
    path = [] if key is None else [key]
    while node is not None:
        node, k = node
        path.append(k)
    out = "$"
    for p in reversed(path):
        out += f"[{p}]" if isinstance(p, int) else f".{p}" if re.fullmatch(r"\w{1,40}", p) else f"[{json.dumps(p[:40])}]"
    return out if len(out) <= 200 else out[:100] + "…" + out[-99:]


def _bad_text(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _scalar(item: Any, node: Any) -> int:
    """The characters of text in a value that is not a container, or a JsonError."""
    if isinstance(item, str):
        if _bad_text(item):
            raise JsonError("invalid_unicode", f"text with a lone surrogate (invalid Unicode) at {_where(node)}")
        return len(item)
    if isinstance(item, float):
        if not math.isfinite(item):
            shown = item.text if isinstance(item, _Literal) else repr(item)
            raise JsonError("non_finite", f"{shown} at {_where(node)} is not a finite number")
        return 0
    if isinstance(item, int) or item is None:  # bool is an int
        return 0
    raise JsonError("invalid", f"a {type(item).__name__} at {_where(node)} is not JSON")


def validate(value: Any, *, max_depth: int = MAX_DEPTH, max_chars: int | None = None) -> Any:
    """`value` itself if it is plain JSON PostgreSQL can store: dicts with text keys,
    lists, text, finite numbers, booleans and null, at most `max_depth` levels deep
    (and, with `max_chars`, at most that many characters of text in all); otherwise a
    JsonError naming the problem and its place (`$.script[0].final`).

    Walked with a stack, not recursion: data some other parser decoded may be deeper
    than Python's recursion limit. Text and integers are checked where they are met;
    the path to an item is a `(parent, key)` chain, spelled out only for an error."""
    total = 0
    stack: list[tuple[Any, Any, int]] = [(value, None, 0)]
    while stack:
        item, node, depth = stack.pop()
        if isinstance(item, dict):
            if depth >= max_depth:
                raise JsonError("too_deep", f"the JSON is nested deeper than {max_depth} levels (at {_where(node)})")
            for key, child in item.items():
                if not isinstance(key, str):
                    raise JsonError("invalid", f"a key that is not text at {_where(node)}")
                if _bad_text(key):
                    raise JsonError("invalid_unicode", f"a key with a lone surrogate (invalid Unicode) at {_where(node)}")
                total += len(key)
                kind = type(child)
                if kind is str:
                    if _bad_text(child):
                        raise JsonError("invalid_unicode", f"text with a lone surrogate (invalid Unicode) at {_where(node, key)}")
                    total += len(child)
                elif kind is not int and kind is not bool and child is not None:
                    stack.append((child, (node, key), depth + 1))
        elif isinstance(item, (list, tuple)):
            if depth >= max_depth:
                raise JsonError("too_deep", f"the JSON is nested deeper than {max_depth} levels (at {_where(node)})")
            for i, child in enumerate(item):
                kind = type(child)
                if kind is str:
                    if _bad_text(child):
                        raise JsonError("invalid_unicode", f"text with a lone surrogate (invalid Unicode) at {_where(node, i)}")
                    total += len(child)
                elif kind is not int and kind is not bool and child is not None:
                    stack.append((child, (node, i), depth + 1))
        else:
            total += _scalar(item, node)
        if max_chars is not None and total > max_chars:
            raise JsonError("too_large", f"the value holds over {max_chars:,} characters of text")
    return value
