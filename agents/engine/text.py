"""One-line text: what a notification line or a rule's reason may hold.

A reason with CR/LF forged a whole "URGENT, approve at once" entry in the reviewers'
digest and broke out of a Slack quote (issue 34, item 8). `one_line` collapses line
breaks, other control characters and bidirectional overrides to one space and caps the
length, so a field stays one line of the line it is put in.
"""

from __future__ import annotations

import re

ONE_LINE_MAX = 200  # characters, the ellipsis included

# Whitespace (CR, LF, tab, NEL, U+2028/2029...), C0 and C1 controls, and the bidi
# embeddings, overrides and isolates, which can make a line read in another order.
_BREAKS = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")


def one_line(text: object, limit: int = ONE_LINE_MAX) -> str:
    """`text` as one line of at most `limit` characters (cut with "…")."""
    line = _BREAKS.sub(" ", "" if text is None else str(text)).strip()
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
