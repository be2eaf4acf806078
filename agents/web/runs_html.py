"""The runs list's rows, from the Jinja2 template agents/jinja2/agents/runs_rows.html.

The list shows 50 runs; through the Django template engine a row cost about 110 µs (every
variable and filter of it a node to resolve), two thirds of the page's time. Jinja2
compiles the template to Python and escapes every value unless the template says
otherwise (agents/web/jinja.py). The page around the rows stays in agents/runs.html,
which calls `rows` through the `run_rows` filter.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from django.utils.safestring import SafeString

from agents.web.jinja import fragment


def rows(runs: list[Any]) -> SafeString:
    """The table rows of `runs` (each with its profile), times in the current time zone."""
    return fragment("agents/runs_rows.html", {"runs": runs, "tz": timezone.get_current_timezone()})
