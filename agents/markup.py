"""What the page fragments built in Python share (agents/timeline_html.py,
reviews/card_html.py): text escaped as the templates' autoescape escapes it, and the
`pluralize` filter they stand in for."""

from __future__ import annotations

from html import escape
from typing import Any


def esc(value: Any) -> str:
    """A value as inert HTML text, the way `{{ value }}` prints it (None prints "None")."""
    return escape(str(value))


def plural(count: Any, forms: str = ",s") -> str:
    """`{{ count|pluralize:forms }}`: the singular form for 1, the plural otherwise."""
    one, many = forms.split(",")
    return one if count == 1 else many
