"""Formatting for the run pages: money in micro-dollars, durations, JSON."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def usd(micros: int | None) -> str:
    """Micro-dollars as dollars: enough digits that a cheap step is not "$0.00"."""
    if micros is None:
        return "—"
    dollars = micros / 1_000_000
    if micros == 0:
        return "$0"
    if dollars >= 1:
        return f"${dollars:,.2f}"
    return f"${dollars:.6f}".rstrip("0")


@register.filter
def ms(value: int | None) -> str:
    if value is None:
        return "—"
    if value < 1000:
        return f"{value} ms"
    return seconds(value / 1000)


def seconds(total: float) -> str:
    if total < 60:
        return f"{total:.1f} s"
    minutes, secs = divmod(int(total), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def since(start: dt.datetime | None, end: dt.datetime | None) -> str:
    """The span from `start` to `end` (or to now, for a run still going)."""
    if start is None:
        return "—"
    end = end or dt.datetime.now(tz=dt.UTC)
    return seconds(max((end - start).total_seconds(), 0.0))


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@register.filter
def number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


@register.filter
def cut_for_model(content: str) -> bool:
    """True when the engine cut this tool result at the transcript cap."""
    from agents.timeline import TRUNCATION_MARK

    return TRUNCATION_MARK in (content or "")
