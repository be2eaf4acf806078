"""Template filters for the run pages: formatting (agents/formatting.py), JSON, and
whether a tool result was cut at the transcript cap."""

from __future__ import annotations

import json
from typing import Any

from django import template

from agents import formatting
from agents.timeline import TRUNCATION_MARK

register = template.Library()

register.filter("usd", formatting.usd)
register.filter("ms", formatting.ms)
register.filter("since", formatting.since)
register.filter("number", formatting.number)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@register.filter
def cut_for_model(content: str) -> bool:
    """True when the engine cut this tool result at the transcript cap."""
    return TRUNCATION_MARK in (content or "")
