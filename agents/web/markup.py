"""What the Jinja2 fragments (agents/web/jinja.py) take from Django's templates: the
`pluralize` filter and `{% url %}` for many ids (their `url` filter)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.urls import get_script_prefix, get_urlconf, reverse

# An id no URL prefix contains: a URL is reversed once with it, then each row's id put
# in its place (a reverse() per link cost 10 µs, x50 a page).
_MARK = 987654321987654
_MARK_TEXT = str(_MARK)


def plural(count: Any, forms: str = ",s") -> str:
    """`{{ count|pluralize:forms }}`: the singular form for 1, the plural otherwise."""
    one, many = forms.split(",")
    return one if count == 1 else many


@functools.lru_cache(maxsize=64)
def _reversed(name: str, urlconf: str, prefix: str) -> str:
    return reverse(name, urlconf=urlconf, args=[_MARK])


# The URL configuration and script prefix of the fragment being rendered (fixed_links):
# each costs a context-local lookup to ask, 150 links a page.
_fixed = threading.local()


def _where() -> tuple[str, str]:
    return get_urlconf() or settings.ROOT_URLCONF, get_script_prefix()


@contextlib.contextmanager
def fixed_links() -> Iterator[None]:
    """Within: url_for() takes the URL configuration and script prefix as they were on
    entry (nothing changes them while a template renders)."""
    before = getattr(_fixed, "where", None)
    _fixed.where = _where()
    try:
        yield
    finally:
        _fixed.where = before


def url_for(name: str, pk: int) -> str:
    """`{% url name pk %}`, reversing once per URL configuration and script prefix."""
    return _reversed(name, *(getattr(_fixed, "where", None) or _where())).replace(_MARK_TEXT, str(pk))
