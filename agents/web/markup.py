"""What the Jinja2 fragments (agents/web/jinja.py) take from Django's templates: the
`pluralize` filter and `{% url %}` for many ids (their `url` filter)."""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from django.urls import get_script_prefix, get_urlconf, reverse

# An id no URL prefix contains: a URL is reversed once with it, then each row's id put
# in its place (a reverse() per link cost 10 µs, x50 a page).
_MARK = 987654321987654


def plural(count: Any, forms: str = ",s") -> str:
    """`{{ count|pluralize:forms }}`: the singular form for 1, the plural otherwise."""
    one, many = forms.split(",")
    return one if count == 1 else many


@functools.lru_cache(maxsize=64)
def _reversed(name: str, urlconf: str, prefix: str) -> str:
    return reverse(name, urlconf=urlconf, args=[_MARK])


def url_for(name: str, pk: int) -> str:
    """`{% url name pk %}`, reversing once per URL configuration and script prefix."""
    return _reversed(name, get_urlconf() or settings.ROOT_URLCONF, get_script_prefix()).replace(str(_MARK), str(pk))
