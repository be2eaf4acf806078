"""Regular expressions from people and servers, matched in linear time.

Python's `re` backtracks: `^(a+)+$` against thirty `a`s and a `!` takes minutes, holding
the GIL, so every thread of the worker stops with it. Every pattern Airlock did not
write itself (a policy rule's `matches`, a tool schema's `pattern` and
`patternProperties`) runs on RE2 instead (google-re2), whose time grows with the text,
never with how the pattern could backtrack. RE2 has no lookaround and no
backreferences: such a pattern is refused when it is saved or synced, with RE2's reason.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

# The longest text a pattern is matched against. Longer text is not matched: a rule on it
# fails closed (an ask or deny rule matches, an allow rule does not), a schema refuses it.
MAX_TEXT = 100_000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported to whoever wrote it, not to stderr


class RegexError(ValueError):
    """A pattern RE2 cannot compile; the message is RE2's reason."""


@functools.lru_cache(maxsize=1024)
def compile(pattern: str) -> Any:  # noqa: A001 - the module is used as `regex.compile`
    """The compiled pattern (cached), or RegexError."""
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(f"{reason} (patterns use RE2 syntax: no lookaround, no backreferences)") from None


def search(pattern: str, text: str) -> bool:
    """Whether the pattern matches somewhere in the text (as `re.search`)."""
    if len(text) > MAX_TEXT:
        raise RegexError(f"text over {MAX_TEXT:,} characters is not matched against a pattern")
    return compile(pattern).search(text) is not None
