"""The timeline's entries, from the Jinja2 template agents/jinja2/agents/timeline_entries.html.

A page shows 50 entries; through the Django template engine each cost about 170 µs
(every variable, filter and `{% if %}` is a node to resolve), which made the entries most
of the page's time. Jinja2 compiles the template to Python and escapes every value unless
the template says otherwise (agents/web/jinja.py): everything a model, a tool or a
reviewer produced (payloads, messages, notes, names) stays inert text. The page around the
entries (header, chart, poller) stays in agents/run_detail.html, whose `more` and `live`
partials call `entries`.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from django.utils.safestring import SafeString

from agents.engine.transcript import TRANSCRIPT_CAP
from agents.web.jinja import fragment
from agents.web.timeline import PAGE_TEXT_MAX, Entry

FOLD_OVER = 600  # characters: a longer result or argument list is folded into <details>


def entries(items: list[Entry], fork: Any = None) -> SafeString:
    """The entries of a page, a live answer or a "load more", in order. `fork`
    (`{"url"}`, from the run page when the viewer may fork this ended run): each resting
    point gets a "Fork from here" link to that URL, the fork's page."""
    return fragment(
        "agents/timeline_entries.html",
        {
            "items": items,
            "fork": fork or None,
            # The current time zone once for all, as the `date` filter shows times in it.
            "tz": timezone.get_current_timezone(),
            "cap": TRANSCRIPT_CAP,
            "page_max": PAGE_TEXT_MAX,
            "fold_over": FOLD_OVER,
        },
    )
