"""The Jinja2 environment of the fragments a page repeats many times (the runs list's rows,
the queue's cards and the timeline's entries), rendered through Django's
`jinja2` backend (TEMPLATES in config/settings.py, templates in each app's `jinja2/`).

A fragment sees only what is put here: the formatting helpers of agents/web/formatting.py
and a few of Django's as filters (`truncatechars`, `localtime`, `pluralize`), `url` for
`{% url %}`, `get` for a dict's key that may be missing, the timeline's `page_text` and
`cut_for_model`, and the `do` tag (`{% do parts.append(x) %}`). No Django template tags, and no
`request` unless a caller passes one. Filters, not functions or methods, because a
filter is a direct call in the compiled template and a call goes through the context:
`{{ 'run_detail'|url(run.pk) }}`, `{{ when|strftime('%H:%M') }}`.

Every `{{ value }}` is escaped unless the template says `|safe`, by Jinja2's own
(markupsafe's) escape, which spells two characters differently from Django's: `"` is
`&#34;` there and `&quot;` in Django, `'` is `&#39;` there and `&#x27;` in Django.
`fragment()` turns those two back into Django's spelling, so a fragment moved from a
Django template or a string builder prints the same bytes as before and the page around
it escapes alike. The respelling is the same character reference written another way,
so it changes nothing a browser decodes (fragments hold no inline script, which would not
decode it), and doing it over the rendered text costs far less than escaping every
value in Python as Django does (bench/fragments.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.template import engines
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from jinja2 import Environment, StrictUndefined

from agents.engine.policy import shadow_label
from agents.web import formatting
from agents.web.markup import fixed_links, plural, url_for
from agents.web.timeline import cut_for_model, page_text


def fragment(name: str, context: dict[str, Any]) -> SafeString:
    """The Jinja2 template `name` rendered with `context`, for a Django page to print."""
    with fixed_links():
        html = engines["jinja2"].get_template(name).render(context)
    # Safe: Jinja2 escaped every value the template did not mark safe itself.
    return mark_safe(html.replace("&#34;", "&quot;").replace("&#39;", "&#x27;"))


def truncatechars(value: Any, length: int) -> str:
    """`{{ value|truncatechars:length }}` (Django's: NFC-normalised, "…" counted in)."""
    return Truncator(value).chars(length)


def url(name: str, *args: Any) -> str:
    """`{% url name arg ... %}`; with one id (a link per row), reversed once and reused."""
    return url_for(name, args[0]) if len(args) == 1 else reverse(name, args=args or None)


def isoformat(value: dt.datetime) -> str:
    return value.isoformat()


def strftime(value: dt.datetime, spec: str) -> str:
    return value.strftime(spec)


def timestamp(value: dt.datetime) -> int:
    """Whole seconds since the epoch (a card's `data-since`, `data-until`)."""
    return int(value.timestamp())


def get(value: Any, key: str) -> Any:
    """`value.key` as a Django template looks it up in a dict: "" when it is not there
    (or `value` is no dict), where StrictUndefined would raise."""
    return value.get(key, "") if isinstance(value, dict) else ""


def environment(**options: Any) -> Environment:
    # A misspelt name in a fragment raises instead of printing nothing (Django's backend
    # always passes its own choice, Undefined or DebugUndefined, so this one is forced).
    options["undefined"] = StrictUndefined
    # A line holding only a block tag ({% for %}, {% if %}) prints nothing, not a blank
    # line: the fragments keep the line layout of the HTML they print.
    options.setdefault("trim_blocks", True)
    options.setdefault("lstrip_blocks", True)
    # {% do list.append(...) %}: the timeline's entries collect their notes, then join them.
    options.setdefault("extensions", ["jinja2.ext.do"])
    env = Environment(**options)
    env.filters.update(
        usd=formatting.usd,
        ms=formatting.ms,
        since=formatting.since,
        number=formatting.number,
        short_duration=formatting.short_duration,
        duration=formatting.duration,  # a time to decision, `—` for none
        pretty_json=formatting.pretty_json,
        truncatechars=truncatechars,
        localtime=timezone.localtime,  # |localtime(tz): pass the page's zone, looked up once
        isoformat=isoformat,
        strftime=strftime,
        timestamp=timestamp,
        get=get,
        page_text=page_text,  # (text as a page shows it, whether it was cut)
        cut_for_model=cut_for_model,
        url=url,
        pluralize=plural,  # |pluralize('y,ies'), as Django's |pluralize:"y,ies"
        shadow_label=shadow_label,  # "shadow rule 3 would have allowed this"
    )
    return env
