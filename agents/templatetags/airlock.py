"""Template filters for the run pages: formatting (agents/web/formatting.py), JSON, a page
of timeline entries (agents/web/timeline_html.py) and the runs list's rows
(agents/web/runs_html.py)."""

from __future__ import annotations

from django import template

from agents.web import formatting, runs_html, timeline_html

register = template.Library()

register.filter("usd", formatting.usd)
register.filter("ms", formatting.ms)
register.filter("since", formatting.since)
register.filter("number", formatting.number)
register.filter("duration", formatting.duration)
register.filter("percent", formatting.percent)
register.filter("pretty_json", formatting.pretty_json)
register.filter("timeline_entries", timeline_html.entries)
register.filter("run_rows", runs_html.rows)
