"""Money, durations and JSON as people read them: plain functions, no Django.

The template filters (agents/templatetags/airlock.py), the timeline's chart labels and
the review cards all format through here, so a cost or a wait reads the same on every
page (reviews.js formats waiting times the same way as `short_duration`).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any


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


def ms(value: int | None) -> str:
    """A step's duration in milliseconds: `420 ms`, `3.2 s`, `2 min 05 s`."""
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


def since(start: dt.datetime | None, end: dt.datetime | None) -> str:
    """The span from `start` to `end` (or to now, for a run still going)."""
    if start is None:
        return "—"
    end = end or dt.datetime.now(tz=dt.UTC)
    return seconds(max((end - start).total_seconds(), 0.0))


def short_duration(total: float) -> str:
    """`12 s`, `4 min`, `2 h 5 min`, `3 d 4 h`: how long a call has waited."""
    s = max(0, int(total))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def duration(total: float | None) -> str:
    """A time to decision: `—` when there was none to measure."""
    return "—" if total is None else seconds(round(total, 1))


def percent(share: float) -> str:
    return f"{share:.0%}"


def number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def pretty_json(value: Any) -> str:
    """JSON indented, keys sorted, for reading (arguments, grants, edits)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
