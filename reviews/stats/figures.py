"""The page's figures: plain dataclasses the template reads (rows, the chart laid out as
SVG, fatigue's streaks with their draft rule, the whole page's `Stats`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from agents.engine import policy as engine_policy
from agents.models import AgentProfile
from agents.ops import review_tally
from agents.runs import backtest
from agents.web import formatting

from .timing import Timing


@dataclass
class RuleRow:
    agent: str
    origin: str | None
    index: int | None
    approved: int = 0
    rejected: int = 0
    expired: int = 0
    timing: Timing = field(default_factory=Timing)

    @property
    def label(self) -> str:
        if self.origin is None:
            return "no rule (the tool's risk, taint or always-ask)"
        return engine_policy.rule_label({"origin": self.origin, "index": self.index})

    @property
    def total(self) -> int:
        return self.approved + self.rejected + self.expired

    def share(self, n: int) -> float:
        return n / self.total if self.total else 0.0

    @property
    def approved_share(self) -> float:
        return self.share(self.approved)

    @property
    def rejected_share(self) -> float:
        return self.share(self.rejected)

    @property
    def expired_share(self) -> float:
        return self.share(self.expired)


@dataclass
class ReviewerRow:
    name: str
    approved: int
    rejected: int

    @property
    def total(self) -> int:
        return self.approved + self.rejected


@dataclass
class Bucket:
    start: dt.datetime
    timing: Timing


@dataclass
class Chart:
    """Daily (hourly over one day) p50 and p95 of time to decision, laid out as SVG."""

    buckets: list[Bucket]
    hourly: bool
    WIDTH = 640
    HEIGHT = 200
    LEFT = 64
    BOTTOM = 24
    TOP = 12

    @functools.cached_property
    def top_seconds(self) -> float:
        # Cached: every point of the chart is placed against it (91 days, 4 uses a day).
        highest = max((b.timing.p95 or 0.0 for b in self.buckets), default=0.0)
        return highest or 1.0

    def _x(self, i: int) -> float:
        span = self.WIDTH - self.LEFT - 8
        return round(self.LEFT + (span * i / max(len(self.buckets) - 1, 1)), 1)

    def _y(self, seconds: float) -> float:
        span = self.HEIGHT - self.BOTTOM - self.TOP
        return round(self.TOP + span * (1 - seconds / self.top_seconds), 1)

    @functools.cached_property
    def _placed(self) -> list[tuple[float, float | None, float | None]]:
        """(x, y of p50, y of p95) of each bucket (None where it has none), placed once
        for both lines and the dots, as _x and _y place them."""
        x_span, y_span = self.WIDTH - self.LEFT - 8, self.HEIGHT - self.BOTTOM - self.TOP
        left, top, highest, last = self.LEFT, self.TOP, self.top_seconds, max(len(self.buckets) - 1, 1)
        return [
            (
                round(left + (x_span * i / last), 1),
                None if t.p50 is None else round(top + y_span * (1 - t.p50 / highest), 1),
                None if t.p95 is None else round(top + y_span * (1 - t.p95 / highest), 1),
            )
            for i, t in enumerate(b.timing for b in self.buckets)
        ]

    @property
    def p50_points(self) -> str:
        return " ".join(f"{x},{y}" for x, y, _ in self._placed if y is not None)

    @property
    def p95_points(self) -> str:
        return " ".join(f"{x},{y}" for x, _, y in self._placed if y is not None)

    @property
    def dots(self) -> list[tuple[float, float, float]]:
        """(x, y of p95, y of p50) of each bucket with a p50: as tuples, which the
        template unpacks without an attribute lookup each (91 over 90 days)."""
        return [(x, y95 if y95 is not None else y50, y50) for x, y50, y95 in self._placed if y50 is not None]

    @property
    def rows(self) -> list[tuple[str, int, str, str]]:
        """The chart's table: (bucket, decisions, p50, p95), formatted."""
        label = "%Y-%m-%d %H:00" if self.hourly else "%Y-%m-%d"
        duration = formatting.duration
        return [
            (b.start.strftime(label), b.timing.n, duration(b.timing.p50), duration(b.timing.p95)) for b in self.buckets
        ]

    @property
    def baseline(self) -> float:
        return self.HEIGHT - self.BOTTOM

    @property
    def has_data(self) -> bool:
        return any(b.timing.n for b in self.buckets)

    @property
    def label_format(self) -> str:
        return "%H:00" if self.hourly else "%b %d"

    @property
    def ticks(self) -> list[dict[str, Any]]:
        """At most 8 x-axis labels, first and last included."""
        n = len(self.buckets)
        step = max(1, math.ceil(n / 8))
        picked = sorted({*range(0, n, step), n - 1}) if n else []
        anchor = {0: "start", n - 1: "end"}
        return [
            {"x": self._x(i), "text": self.buckets[i].start.strftime(self.label_format), "anchor": anchor.get(i, "middle")}
            for i in picked
        ]

    @property
    def top_label(self) -> str:
        return formatting.short_duration(self.top_seconds)


@dataclass
class Streak:
    """Approval fatigue: one rule's (or one tool's) calls approved unchanged in a row."""

    agent: AgentProfile
    tool: str
    origin: str | None
    index: int | None
    length: int
    refusal: str = ""  # why no draft is offered
    draft: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        if self.origin is None:
            return f"{self.tool} calls no rule asked about"
        return f"{self.tool} calls that {engine_policy.rule_label({'origin': self.origin, 'index': self.index})} asked about"

    @property
    def draft_json(self) -> str:
        return json.dumps(self.draft, indent=2, sort_keys=True)

    def proposal(self) -> dict[str, Any]:
        """The profile's rules with the draft placed right before the rule that asked
        (first match wins, so there it would decide those calls), or last."""
        rules = list(self.agent.rules or [])
        at = (self.index - 1) if self.origin == "profile" and self.index else len(rules)
        rules.insert(min(at, len(rules)), self.draft)
        return {"rules": rules}

    @property
    def backtest_url(self) -> str:
        base = reverse("admin:agents_agentprofile_backtest", args=[self.agent.pk])
        return f"{base}?{urlencode({'policy': json.dumps(self.proposal())})}"


@dataclass(frozen=True)
class Oldest:
    """The call that has waited longest, and how many wait."""

    pk: int
    tool: str
    created_at: dt.datetime
    agent: str
    waiting: int


@dataclass
class Stats:
    days: int
    since: dt.datetime
    now: dt.datetime
    pending: int
    oldest: Oldest | None
    overall: Timing
    reviewers: list[ReviewerRow]
    agents: list[tuple[str, Timing]]
    rules: list[RuleRow]
    escalations: list[tuple[str, int]]
    lapsed: list[tuple[str, int]]
    chart: Chart
    shadow: list[tuple[AgentProfile, list[backtest.Agreement]]]
    fatigue: list[Streak]
    streak_needed: int
    bucketed: bool = False  # percentiles from the tallies' buckets, not exact

    @property
    def bucket_error_percent(self) -> float:
        return round(review_tally.MAX_ERROR * 100, 1)

    @property
    def oldest_age(self) -> float:
        return (self.now - self.oldest.created_at).total_seconds() if self.oldest else 0.0

    @property
    def escalated(self) -> int:
        return sum(n for _, n in self.escalations)

    @property
    def lapsed_total(self) -> int:
        return sum(n for _, n in self.lapsed)
