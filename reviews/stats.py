"""How reviewing goes (`/reviews/stats/`): what waits, who decided, how long decisions
take, what escalated or lapsed, shadow rules' agreement, and approval fatigue.

Every figure is an aggregate the database computes over the approvals decided in the
window (`decided_at`), on the approvals the viewer may see (agents/access.py). Time to
decision is `decided_at - created_at` of the calls a person answered (approved or
rejected); its percentiles are PostgreSQL's `percentile_cont`, and on SQLite (the
embedded default, which has none) the same interpolation over the durations read back
(to the millisecond, which is what SQLite's date functions count).
"""

from __future__ import annotations

import array
import bisect
import datetime as dt
import functools
import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connections
from django.db.models import (
    Aggregate,
    Count,
    F,
    FloatField,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Window,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Trunc
from django.urls import reverse
from django.utils import timezone

from agents import access
from agents.engine import decisions, drafts, streaks
from agents.engine import policy as engine_policy
from agents.lib.rows import Joined, Rows, placeholders
from agents.models import AgentProfile, Approval, ApprovalClaim, ReviewStreak, ReviewTally, ReviewTiming, Run
from agents.ops import review_tally
from agents.runs import backtest
from agents.web import formatting

WINDOWS = (1, 7, 30, 90)
DEFAULT_DAYS = 7
# A streak is shown while its newest call closed in the last FATIGUE_DAYS. The folded
# streaks count every call; where the calls are walked instead (_walked), the newest
# FATIGUE_SCAN are read, so the walk stays bounded however much history there is.
FATIGUE_DAYS = max(WINDOWS)
FATIGUE_SCAN = 5000
DRAFT_SAMPLE = 1000  # the newest approved calls of a streak a draft is derived from
PEOPLE = (decisions.APPROVED, decisions.REJECTED)  # statuses only a person's answer sets
CLOSED = (*PEOPLE, decisions.EXPIRED)


class BadWindow(ValueError):
    pass


def window_days(raw: str | None) -> int:
    """`?days=`: one of WINDOWS (default DEFAULT_DAYS); BadWindow says what is accepted."""
    if raw is None or raw == "":
        return DEFAULT_DAYS
    if raw.isdigit() and int(raw) in WINDOWS:
        return int(raw)
    shown = raw[:20]
    raise BadWindow(f"days must be one of {', '.join(map(str, WINDOWS))}, not {shown!r}")


# -- time to decision ------------------------------------------------------------------


class Seconds(Func):
    """decided_at - created_at in seconds, as each database spells it."""

    output_field = FloatField()
    arg_joiner = " - "
    template = "EXTRACT(EPOCH FROM (%(expressions)s))"

    def __init__(self) -> None:
        super().__init__(F("decided_at"), F("created_at"))

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # SQLite's date functions count whole milliseconds, but a julianday (about 2.46
        # million days) as a double keeps only ~40 us of them: 20 s came out 19.99997.
        # Rounded to the millisecond, the difference is the one SQLite measured.
        return self.as_sql(
            compiler, connection, template="round((julianday(%(expressions)s)) * 86400.0, 3)",
            arg_joiner=") - julianday(", **extra
        )


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate (`fraction` is a constant of this module)."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=repr(float(fraction)), **extra)


def percentile_cont(values: Sequence[float], fraction: float) -> float | None:
    """What `percentile_cont` answers: linear interpolation between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    pos = fraction * (len(ordered) - 1)
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Timing:
    n: int = 0
    p50: float | None = None
    p95: float | None = None


def timings(qs: QuerySet[Any], keys: dict[str, Any], *, in_database: bool | None = None) -> dict[tuple[Any, ...], Timing]:
    """Time to decision of the people-decided approvals in `qs`, grouped by `keys`
    (name -> expression). In the database where it has `percentile_cont`; otherwise
    from the durations read back (`in_database=False` forces that, for the tests)."""
    decided = qs.filter(status__in=PEOPLE)
    names = list(keys)
    if in_database is None:
        in_database = connections[qs.db].vendor == "postgresql"
    if in_database:
        secs = Seconds()
        figures = {"n": Count("pk"), "p50": PercentileCont(secs, 0.5), "p95": PercentileCont(secs, 0.95)}
        if not keys:
            # .values() with no names would group by every column: one aggregate instead.
            r = decided.aggregate(**figures)
            return {(): Timing(r["n"], r["p50"], r["p95"])} if r["n"] else {}
        rows = decided.values(**keys).annotate(**figures).order_by()
        return {tuple(r[k] for k in names): Timing(r["n"], r["p50"], r["p95"]) for r in rows}
    groups: dict[tuple[Any, ...], list[float]] = {}
    for row in decided.annotate(_s=Seconds(), **keys).values_list(*names, "_s").order_by():
        groups.setdefault(tuple(row[:-1]), []).append(float(row[-1]))
    return {
        k: Timing(len(v), percentile_cont(v, 0.5), percentile_cont(v, 0.95)) for k, v in groups.items()
    }


# -- the page's figures ---------------------------------------------------------------


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


# _oldest over every call, written out (PostgreSQL): the page reads it on every load,
# and the queryset cost more to build than to run.
_OLDEST_SQL = """
    SELECT a.id, a.tool, a.created_at, p.name, COUNT(a.id) OVER () FROM agents_approval a
    JOIN agents_run r ON r.id = a.run_id JOIN agents_agentprofile p ON p.id = r.profile_id
    WHERE a.status = %s ORDER BY a.created_at, a.id LIMIT 1
"""


def _every_call(approvals: QuerySet[Approval]) -> bool:
    """Whether `approvals` (access.visible_approvals of the viewer) is every call: no
    visibility rule narrows it, so the page's written-out reads of all calls serve it."""
    return not approvals.query.where


def _written_out(approvals: QuerySet[Approval]) -> bool:
    """Whether the written-out PostgreSQL reads of every call answer for `approvals`."""
    return _every_call(approvals) and connections[approvals.db].vendor == "postgresql"


def _oldest(approvals: QuerySet[Approval]) -> Oldest | None:
    """The oldest pending call among `approvals` and, beside it, how many wait: one
    statement."""
    if _written_out(approvals):
        with connections[approvals.db].cursor() as cur:
            cur.execute(_OLDEST_SQL, [decisions.PENDING])
            row = cur.fetchone()
        return None if row is None else Oldest(*row)
    found = (
        approvals.pending().select_related("run__profile")
        .only("tool", "created_at", "run__profile__name")
        .annotate(waiting=Window(Count("pk"))).order_by("created_at", "pk").first()
    )
    return None if found is None else Oldest(found.pk, found.tool, found.created_at, found.run.profile.name, found.waiting)


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


# The agent of an approval. Over a short window, looked up per row by the run's primary
# key: a join let the planner hash every run (a scan of 100,000 wide rows) to name the
# 8,000 calls of a week, 1.7x the page's time. Over 30 or 90 days most runs are read
# anyway and the join's one scan is 3.5x faster than a lookup per row (bench/stats.py).
AGENT = Subquery(Run.objects.filter(pk=OuterRef("run_id")).values("profile__name")[:1])
AGENT_JOINED = F("run__profile__name")
AGENT_ID = Subquery(Run.objects.filter(pk=OuterRef("run_id")).values("profile_id")[:1])
SHORT_WINDOW_DAYS = 7


def _rule_keys(agent: Any) -> dict[str, Any]:
    return {"agent": agent, "origin": KT("rule__origin"), "index": KT("rule__index")}


@dataclass
class WindowFigures:
    """Everything the page reads from the calls closed in the window."""

    overall: Timing
    agents: list[tuple[str, Timing]]
    rules: list[RuleRow]
    reviewers: list[ReviewerRow]
    buckets: dict[dt.datetime, Timing]


def _rule_row(agent: str, origin: str | None, index: Any, approved: int, rejected: int, expired: int, timing: Timing) -> RuleRow:
    return RuleRow(agent, origin, int(index) if index is not None else None, approved, rejected, expired, timing)


def _sorted(figures: WindowFigures) -> WindowFigures:
    figures.agents.sort(key=lambda a: a[0])
    figures.rules.sort(key=lambda row: (row.agent, row.origin or "~", row.index or 0))
    figures.reviewers.sort(key=lambda r: r.name)
    return figures


def _window_orm(window: QuerySet[Approval], bucket: Any, agent: Any) -> WindowFigures:
    """One aggregate per figure, through `timings` (SQLite's way)."""
    closed = window.filter(status__in=CLOSED)
    keys = _rule_keys(agent)
    counted = closed.values(**keys).annotate(
        approved=Count("pk", filter=Q(status=decisions.APPROVED)),
        rejected=Count("pk", filter=Q(status=decisions.REJECTED)),
        expired=Count("pk", filter=Q(status=decisions.EXPIRED)),
    ).order_by()
    times = timings(window, keys)
    rules = [
        _rule_row(r["agent"], r["origin"], r["index"], r["approved"], r["rejected"], r["expired"],
                  times.get((r["agent"], r["origin"], r["index"]), Timing()))
        for r in counted
    ]
    reviewers = [
        ReviewerRow(r["name"] or "(deleted user)", r["approved"], r["rejected"])
        for r in window.filter(status__in=PEOPLE).values(name=F("decided_by__username")).annotate(
            approved=Count("pk", filter=Q(status=decisions.APPROVED)),
            rejected=Count("pk", filter=Q(status=decisions.REJECTED)),
        ).order_by()
    ]
    return _sorted(WindowFigures(
        overall=timings(window, {}).get((), Timing()),
        agents=[(k[0], t) for k, t in timings(window, {"agent": agent}).items()],
        rules=rules,
        reviewers=reviewers,
        buckets={k[0]: t for k, t in timings(window, {"bucket": bucket}).items()},
    ))


# GROUPING(agent, origin, idx, who, bucket): a bit is set for each column a row is NOT grouped by.
_BY_RULE, _BY_AGENT, _OVERALL, _BY_REVIEWER, _BY_BUCKET = 0b00011, 0b01111, 0b11111, 0b11101, 0b11110


def _window_grouped(window: QuerySet[Approval], bucket: Any, agent: Any) -> WindowFigures:
    """Every figure in one scan of the window: PostgreSQL's GROUPING SETS over the
    closed calls (the ORM writes the inner query, visibility rules included)."""
    inner = window.filter(status__in=CLOSED).annotate(
        s_agent=agent, s_origin=KT("rule__origin"), s_idx=KT("rule__index"), s_who=F("decided_by__username"),
        s_bucket=bucket, s_secs=Seconds(),
    ).values("s_agent", "s_origin", "s_idx", "s_who", "s_bucket", "s_secs", "status")
    sql, params = inner.query.sql_with_params()
    people = "status IN ('approved', 'rejected')"
    grouped = f"""
        SELECT GROUPING(s_agent, s_origin, s_idx, s_who, s_bucket), s_agent, s_origin, s_idx, s_who, s_bucket,
               count(*) FILTER (WHERE status = 'approved'), count(*) FILTER (WHERE status = 'rejected'),
               count(*) FILTER (WHERE status = 'expired'), count(*) FILTER (WHERE {people}),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY s_secs) FILTER (WHERE {people}),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY s_secs) FILTER (WHERE {people})
        FROM ({sql}) w
        GROUP BY GROUPING SETS ((s_agent, s_origin, s_idx), (s_agent), (), (s_who), (s_bucket))
    """
    figures = WindowFigures(Timing(), [], [], [], {})
    with connections[window.db].cursor() as cur:
        cur.execute(grouped, params)
        for g, agent, origin, idx, who, at, approved, rejected, expired, n, p50, p95 in cur.fetchall():
            timing = Timing(n, p50, p95) if n else Timing()
            if g == _BY_RULE:
                figures.rules.append(_rule_row(agent, origin, idx, approved, rejected, expired, timing))
            elif g == _BY_AGENT and n:
                figures.agents.append((agent, timing))
            elif g == _OVERALL:
                figures.overall = timing
            elif g == _BY_REVIEWER and n:
                figures.reviewers.append(ReviewerRow(who or "(deleted user)", approved, rejected))
            elif g == _BY_BUCKET and n:
                # A raw cursor skips the ORM's converters: date_trunc's timestamp is UTC.
                figures.buckets[at if at.tzinfo else at.replace(tzinfo=dt.UTC)] = timing
    return _sorted(figures)


@dataclass(frozen=True)
class _TallyScope:
    """Which tallies a viewer may read: every one (`primary` None), or those of the
    `primary` profiles and the escalated calls' of the `backup` ones; `key` names it
    (for the cache of past days)."""

    key: str
    primary: tuple[int, ...] | None = None
    backup: tuple[int, ...] = ()

    def q(self) -> Q:
        if self.primary is None:
            return Q()
        return Q(profile_id__in=self.primary) | Q(profile_id__in=self.backup, escalated=True)

    def sql(self) -> tuple[str, list[Any]]:
        """The same as a condition on a tally table's columns, and its parameters."""
        if self.primary is None:
            return "TRUE", []
        return "(profile_id = ANY(%s) OR (profile_id = ANY(%s) AND escalated))", [list(self.primary), list(self.backup)]


def _tally_scope(user: Any) -> _TallyScope | None:
    """Which tallies `user` may read, or None when the tallies cannot answer for them: a
    launcher also sees their own runs' calls, which no tally key tells apart."""
    if access.reads_all_runs(user):
        return _TallyScope("all")
    scope = access.review_scope(user)
    if scope.empty or access.in_group(user, access.LAUNCHER):
        return None
    if scope.everything:
        return _TallyScope("all")
    primary, backup = tuple(sorted(scope.primary)), tuple(sorted(scope.backup))
    return _TallyScope(f"{list(primary)}/{list(backup)}", primary, backup)


def _day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


@dataclass
class _Sums:
    """The tallies of some whole days, summed: counts per (profile id, origin, index,
    reviewer, status); time-to-decision buckets per (profile id, origin, index) and
    per day."""

    counts: dict[tuple[Any, ...], int] = field(default_factory=dict)
    rule_hist: dict[tuple[Any, ...], dict[int, int]] = field(default_factory=dict)
    day_hist: dict[dt.date, dict[int, int]] = field(default_factory=dict)
    # Each day's percentiles, worked out once with the cached sums (none for the fresh).
    day_timing: dict[dt.date, Timing] = field(default_factory=dict)

    def add(self, other: _Sums) -> None:
        for k, n in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        for rule, h in other.rule_hist.items():
            _add_hist(self.rule_hist.setdefault(rule, {}), h)
        for day, h in other.day_hist.items():
            _add_hist(self.day_hist.setdefault(day, {}), h)
            self.day_timing.pop(day, None)


def _add_hist(into: dict[int, int], hist: dict[int, int]) -> None:
    for b, n in hist.items():
        into[b] = into.get(b, 0) + n


# The tallies of some days: the counts, and the buckets grouped per rule and per day,
# in one statement (PostgreSQL). Written out: built as querysets each load, the two
# statements it replaced cost the page more in Python than in the database.
_TALLIED_SQL = """
    SELECT 2, NULL, profile_id, origin, "index", reviewer, status, NULL, SUM(n) FROM agents_reviewtally
    WHERE day >= %s AND day < %s AND {scope} GROUP BY profile_id, origin, "index", reviewer, status
    UNION ALL
    SELECT GROUPING(day), day, profile_id, origin, "index", NULL, NULL, bucket, SUM(n) FROM agents_reviewtiming
    WHERE day >= %s AND day < %s AND {scope} GROUP BY GROUPING SETS ((profile_id, origin, "index", bucket), (day, bucket))
"""


def _tallied_sums(scope: _TallyScope, first: dt.date, until: dt.date) -> _Sums:
    """The tallies of the days from `first` to before `until` that `scope` covers: on
    PostgreSQL one statement (_TALLIED_SQL); on SQLite one for the counts and one for
    each grouping of the buckets."""
    sums = _Sums()
    if connections[ReviewTally.objects.db].vendor == "postgresql":
        where, params = scope.sql()
        with connections[ReviewTally.objects.db].cursor() as cur:
            cur.execute(_TALLIED_SQL.format(scope=where), [first, until, *params, first, until, *params])
            for kind, day, pid, origin, index, reviewer, status, b, n in cur.fetchall():
                if kind == 2:
                    sums.counts[(pid, origin, index, reviewer, status)] = int(n)
                elif kind == 1:
                    sums.rule_hist.setdefault((pid, origin, index), {})[b] = int(n)
                else:
                    sums.day_hist.setdefault(day, {})[b] = int(n)
        return sums
    whole = Q(day__gte=first, day__lt=until) & scope.q()
    for *key, n in ReviewTally.objects.filter(whole).values_list(
        "profile_id", "origin", "index", "reviewer", "status"
    ).annotate(s=Sum("n")).order_by():
        sums.counts[tuple(key)] = n
    timing = ReviewTiming.objects.filter(whole)
    for pid, origin, index, b, n in timing.values_list("profile_id", "origin", "index", "bucket").annotate(
        s=Sum("n")
    ).order_by():
        sums.rule_hist.setdefault((pid, origin, index), {})[b] = n
    for day, b, n in timing.values_list("day", "bucket").annotate(s=Sum("n")).order_by():
        sums.day_hist.setdefault(day, {})[b] = n
    return sums


PAST_CACHE_SECONDS = 86_400
T = TypeVar("T")


def _fresh_from() -> dt.date:
    """The first UTC day the page reads fresh (yesterday): the days before are cached."""
    return timezone.now().astimezone(dt.UTC).date() - dt.timedelta(days=1)


def _past_sums(
    scope: _TallyScope, version: int, profiles: Sequence[int], first: dt.date, until: dt.date
) -> _Sums:
    """_tallied_sums of days before yesterday, through the Django cache, keyed by the
    tallies' `version` (which the fold bumps, in its transaction, when it adds to a day
    before its own; it adds to yesterday without, hence yesterday is read fresh), read
    before the tallies, so an entry never holds less than its version. The profiles
    are in the key: deleting one deletes its tallies."""
    def summed() -> _Sums:
        sums = _tallied_sums(scope, first, until)
        sums.day_timing = {day: _hist_timing(h) for day, h in sums.day_hist.items()}
        return sums

    return _kept("past", f"{version}:{scope.key}:{list(profiles)}:{first}:{until}", _Sums, summed)


def _kept(kind: str, named: str, of_type: type[T], compute: Callable[[], T]) -> T:
    """`compute()` through the Django cache, for PAST_CACHE_SECONDS, under `kind` and the
    hash of `named` (everything the entry depends on)."""
    key = f"reviews.stats.{kind}:" + hashlib.sha256(named.encode()).hexdigest()
    found = cache.get(key)
    if isinstance(found, of_type):
        return found
    found = compute()
    cache.set(key, found, PAST_CACHE_SECONDS)
    return found


def _window_tallied(
    window: QuerySet[Approval], user: Any, names: dict[int, str], version: int, *, since: dt.datetime,
    now: dt.datetime, present: bool = False, untallied: list[Untallied] | None = None, every_call: bool = False,
) -> WindowFigures | None:
    """The window's figures from the daily tallies for its whole UTC days and from the
    approvals themselves for its two partial days and for calls not yet folded; the
    percentiles from log-spaced buckets (within review_tally.MAX_ERROR). None when the
    tallies hold nothing for those days or cannot answer for `user`.

    The days before yesterday are summed once per version of the tallies (_past_sums);
    yesterday and today are read fresh.

    The partial first day, when it is before yesterday, the page has read the calls not
    folded yet (`untallied`) and the viewer sees every call (`every_call`), is cut from
    that day's folded calls kept once per version (_past_calls) instead of read.

    `present`: `now` is the present, so today's tally holds only calls closed before it
    and reads today too (a `now` in the past reads today exactly). `names`: every
    profile's, by id; `version`: the tallies', read before them (review_tally.version);
    `untallied`: the calls not folded yet, when the page read them (_untallied)."""
    scope = _tally_scope(user)
    first = since.astimezone(dt.UTC).date() + dt.timedelta(days=1)
    end = now.astimezone(dt.UTC).date()
    if scope is None or first >= end:
        return None
    until = end + dt.timedelta(days=1) if present else end  # the tallied days end before it
    cached = min(until, _fresh_from())
    sums = _past_sums(scope, version, sorted(names), first, cached) if cached > first else _Sums()
    if until > max(first, cached):
        sums.add(_tallied_sums(scope, max(first, cached), until))
    if not sums.counts:
        return None  # nothing folded for those days: the exact figures
    counts, rule_hist, day_timing = sums.counts, sums.rule_hist, sums.day_timing
    day_hist = {_day_start(day): h for day, h in sums.day_hist.items()}
    # The exact part: the partial days (the first; today unless `present`), and whatever
    # is not folded yet.
    # Each range its own statement: one statement with an OR over them read the whole
    # window through the index and was costed high enough to be JIT-compiled (37 of its
    # 60 ms over a week in bench/stats.py).
    whole_days = (_day_start(first), _day_start(until))
    since_day = first - dt.timedelta(days=1)
    kept_first = bool(version) and every_call and untallied is not None and since_day < _fresh_from()
    parts = [] if kept_first else [Q(decided_at__lt=whole_days[0])]
    if untallied is None:
        parts.append(Q(decided_at__gte=whole_days[0], decided_at__lt=whole_days[1], tallied=False))
    if not present:
        parts.append(Q(decided_at__gte=_day_start(end)))
    groups: list[Any] = []
    for part in parts:  # none, mostly: no queryset is built for nothing
        groups.extend(_exact_groups(window.filter(part, status__in=CLOSED).annotate(
            s_agent_id=AGENT_ID, s_origin=KT("rule__origin"), s_index=KT("rule__index")
        )))
    if kept_first:
        groups.extend(_past_calls(version, sorted(names), since_day).since(since))
    if untallied is not None:  # the calls not folded yet, read once for the page
        start = since if kept_first else whole_days[0]
        groups.extend(_grouped_rows(
            (u.agent_id, u.origin, u.index, u.decided_by_id, u.status, u.created_at, u.decided_at)
            for u in untallied if start <= u.decided_at < whole_days[1]
        ))
    for pid, origin, index, by, status, day, b, n in groups:
        rule = (pid, origin or "", int(index) if index is not None else 0)
        key = (*rule, by or 0, status)
        counts[key] = counts.get(key, 0) + n
        if status in PEOPLE:
            h = rule_hist.setdefault(rule, {})
            h[b] = h.get(b, 0) + n
            d = day_hist.setdefault(day.astimezone(dt.UTC), {})
            d[b] = d.get(b, 0) + n
            day_timing.pop(day.astimezone(dt.UTC).date(), None)
    people = _usernames(k[3] for k in counts)
    rules: dict[tuple[Any, ...], RuleRow] = {}
    reviewers: dict[str, ReviewerRow] = {}
    agent_hist: dict[str, dict[int, int]] = {}
    for (pid, origin, index, by, status), n in counts.items():
        row = rules.setdefault((pid, origin, index), _rule_row(names[pid], origin or None, index if origin else None, 0, 0, 0, Timing()))
        setattr(row, status, getattr(row, status) + n)
        if status in PEOPLE:
            who = people.get(by) or "(deleted user)"
            rr = reviewers.setdefault(who, ReviewerRow(who, 0, 0))
            setattr(rr, status, getattr(rr, status) + n)
    overall: dict[int, int] = {}
    for (pid, origin, index), h in rule_hist.items():
        rules[(pid, origin, index)].timing = _hist_timing(h)
        a = agent_hist.setdefault(names[pid], {})
        for b, n in h.items():
            a[b] = a.get(b, 0) + n
            overall[b] = overall.get(b, 0) + n
    return _sorted(WindowFigures(
        overall=_hist_timing(overall),
        agents=[(name, _hist_timing(h)) for name, h in agent_hist.items()],
        rules=list(rules.values()),
        reviewers=list(reviewers.values()),
        buckets={at: day_timing.get(at.date()) or _hist_timing(h) for at, h in day_hist.items()},
    ))


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(at: dt.datetime) -> int:
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


@dataclass
class _DayCalls:
    """The folded closed calls of one UTC day: each one's decision time (microseconds
    since the epoch, ascending) and its group's place in `groups` (agent id, origin,
    index, reviewer, status, bucket)."""

    day: dt.date
    at: array.array[int] = field(default_factory=lambda: array.array("q"))
    group: array.array[int] = field(default_factory=lambda: array.array("l"))
    groups: list[tuple[Any, ...]] = field(default_factory=list)

    def since(self, start: dt.datetime) -> list[tuple[Any, ...]]:
        """_exact_groups' rows of the calls decided at `start` or after it."""
        counted = Counter(self.group[bisect.bisect_left(self.at, _micros(start)):])
        day = _day_start(self.day)
        return [(*self.groups[g][:5], day, self.groups[g][5], n) for g, n in counted.items()]


def _past_calls(version: int, profiles: Sequence[int], day: dt.date) -> _DayCalls:
    """The closed calls of `day` (before yesterday) that the fold has counted, of every
    call, through the Django cache (the tallies' `version` and the profiles in the key,
    as _past_sums), for the window's partial first day: a folded call of a day before
    yesterday never changes, a call folded into it later bumps the version, and one not
    folded yet is among the page's `untallied`. Each call's bucket is the fold's own
    (review_tally.bucket_of)."""
    def read() -> _DayCalls:
        calls = _DayCalls(day)
        places: dict[tuple[Any, ...], int] = {}
        rows = (
            Approval.objects.filter(
                status__in=CLOSED, tallied=True, decided_at__gte=_day_start(day),
                decided_at__lt=_day_start(day + dt.timedelta(days=1)),
            ).annotate(s_agent_id=AGENT_ID)
            .values_list("decided_at", "s_agent_id", KT("rule__origin"), KT("rule__index"), "decided_by_id", "status",
                         "created_at")
            .order_by("decided_at")
        )
        for decided, *key, created in rows:
            key.append(review_tally.bucket_of((decided - created).total_seconds()))
            calls.at.append(_micros(decided))
            calls.group.append(places.setdefault(tuple(key), len(places)))
        calls.groups = list(places)
        return calls

    return _kept("calls", f"{version}:{list(profiles)}:{day}", _DayCalls, read)


def _events(
    user: Any, approvals: QuerySet[Approval], names: dict[int, str], version: int, *, since: dt.datetime,
    now: dt.datetime,
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Escalations per agent and lapsed claims per claimant in the window (escalated_at,
    and a lapsed claim's end, in it; a claim nothing recorded as lapsed yet by its
    `until`). Counted by the run's profile id, named from the profiles: naming each
    call's agent in the database was a join a call (1,000 calls escalated over 90 days).

    For a viewer who sees every call, the whole days before yesterday are counted once
    (_past_events) and the window's two ends fresh: an escalation is stamped when the
    sweeper makes it, a claim lapses at its `until`, which is only ever moved forward
    from the future (agents/actions/claims.py), so no such day changes afterwards."""
    claims = ApprovalClaim.objects.all() if access.reads_all_runs(user) else ApprovalClaim.objects.filter(approval__in=approvals)
    first = since.astimezone(dt.UTC).date() + dt.timedelta(days=1)
    cutoff = min(now.astimezone(dt.UTC).date(), _fresh_from())
    # A version exists once the fold has written one: a database emptied since (a test's
    # flush) has none, so no entry of its earlier contents can be read back.
    if version and _every_call(approvals) and cutoff > first:
        esc, lapsed = _past_events(version, sorted(names), first, cutoff)
        ends = [(since, _day_start(first), False), (_day_start(cutoff), now, True)]
    else:
        esc, lapsed = {}, {}
        ends = [(since, now, True)]
    if _written_out(approvals):
        for kind, pid, name, n in _every_events(ends):
            if kind == "e":
                esc[pid] = esc.get(pid, 0) + n
            else:
                lapsed[name] = lapsed.get(name, 0) + n
    else:
        esc_q, lapsed_q = Q(pk__in=[]), Q(pk__in=[])
        for start, end, last in ends:
            esc_q |= _escalated_in(start, end, last=last)
            lapsed_q |= _lapsed_in(start, end, last=last)
        for pid, n in approvals.filter(esc_q).values_list(AGENT_ID).annotate(n=Count("pk")).order_by():
            esc[pid] = esc.get(pid, 0) + n
        for name, n in claims.filter(lapsed_q).values_list("user__username").annotate(n=Count("pk")).order_by():
            lapsed[name] = lapsed.get(name, 0) + n
    return (
        sorted((names.get(pid, "(deleted agent)"), n) for pid, n in esc.items()),
        [(name or "(deleted user)", n) for name, n in sorted(lapsed.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))],
    )


# _escalated_in and _lapsed_in, both and every range at once, in one statement written
# out (PostgreSQL, a viewer who sees every call): built as two querysets each load they
# cost the page more in Python than in the database. The same two rules, kept together.
_EVENTS_SQL = """
    SELECT 'e', (SELECT r.profile_id FROM agents_run r WHERE r.id = a.run_id), NULL, count(*) FROM agents_approval a
    WHERE {escalated} GROUP BY 2
    UNION ALL
    SELECT 'l', NULL, u.username, count(*) FROM agents_approvalclaim c LEFT JOIN auth_user u ON u.id = c.user_id
    WHERE {lapsed} GROUP BY 3
"""


def _escalated_in(start: dt.datetime, end: dt.datetime, *, last: bool) -> Q:
    return Q(escalated_at__gte=start, **{"escalated_at__lte" if last else "escalated_at__lt": end})


def _lapsed_in(start: dt.datetime, end: dt.datetime, *, last: bool) -> Q:
    ended = Q(end="lapsed", ended_at__gte=start, **{"ended_at__lte" if last else "ended_at__lt": end})
    return ended | Q(ended_at__isnull=True, until__gte=start, until__lt=end)


def _every_events(ends: Sequence[tuple[dt.datetime, dt.datetime, bool]]) -> list[tuple[str, Any, Any, int]]:
    """('e', profile id, None, escalations) and ('l', None, claimant's name, lapsed
    claims) of every call over `ends` ((start, end, whether the end is included)), as
    _escalated_in and _lapsed_in count them."""
    escalated: list[str] = []
    lapsed: list[str] = []
    esc_params: list[Any] = []
    lapsed_params: list[Any] = []
    for start, end, last in ends:
        op = "<=" if last else "<"
        escalated.append(f"(a.escalated_at >= %s AND a.escalated_at {op} %s)")
        esc_params += [start, end]
        lapsed.append(
            f"(c.\"end\" = 'lapsed' AND c.ended_at >= %s AND c.ended_at {op} %s)"
            " OR (c.ended_at IS NULL AND c.until >= %s AND c.until < %s)"
        )
        lapsed_params += [start, end, start, end]
    sql = _EVENTS_SQL.format(escalated=" OR ".join(escalated), lapsed=" OR ".join(lapsed))
    with connections[Approval.objects.db].cursor() as cur:
        cur.execute(sql, [*esc_params, *lapsed_params])
        return list(cur.fetchall())


def _past_events(
    version: int, profiles: Sequence[int], first: dt.date, until: dt.date
) -> tuple[dict[int | None, int], dict[str | None, int]]:
    """Escalations per profile id and lapsed claims per claimant's name, of every call,
    over the days from `first` to before `until`, through the Django cache (the tallies'
    `version` and the profiles in the key, as _past_sums)."""
    start, end = _day_start(first), _day_start(until)

    def counted() -> tuple[dict[int | None, int], dict[str | None, int]]:
        esc = dict(
            Approval.objects.filter(_escalated_in(start, end, last=False)).values_list(AGENT_ID)
            .annotate(n=Count("pk")).order_by()
        )
        lapsed = dict(
            ApprovalClaim.objects.filter(_lapsed_in(start, end, last=False)).values_list("user__username")
            .annotate(n=Count("pk")).order_by()
        )
        return esc, lapsed

    return _kept("events", f"{version}:{list(profiles)}:{first}:{until}", tuple, counted)


class BucketOf(Func):
    """review_tally.bucket_of in PostgreSQL: floor(8 * log2(seconds waited)).

    In double precision, as Python's: EXTRACT gives a numeric, and its logarithm made
    the statement over a week's partial first day (950 calls, bench/stats.py) 15.5 ms
    instead of 4.9 (best of 15 each). Over 7.4 million waits (every microsecond to 3 s,
    every millisecond to 50 min, every second to 11 days, the bench's 100,000) both
    gave the same bucket."""

    output_field = IntegerField()
    template = (
        f"floor({review_tally.PER_DOUBLING} * ln(greatest(EXTRACT(EPOCH FROM (%(expressions)s))::float8, "
        f"{review_tally.MIN_SECONDS})) / ln(2))::integer"
    )
    arg_joiner = " - "

    def __init__(self) -> None:
        super().__init__(F("decided_at"), F("created_at"))


def _exact_groups(exact: QuerySet[Approval]) -> list[tuple[Any, ...]]:
    """The calls of `exact` counted per rule, reviewer, status, UTC day and bucket: in
    PostgreSQL (a partial day is thousands of calls, their groups far fewer); on SQLite,
    which may have no logarithm, from the rows read back."""
    rule_fields = ("s_agent_id", "s_origin", "s_index", "decided_by_id", "status")
    if connections[exact.db].vendor == "postgresql":
        # The bucket of an expiry is ignored: it has no time to decision.
        day = Trunc("decided_at", "day", tzinfo=dt.UTC)
        return list(exact.values_list(*rule_fields, day, BucketOf()).annotate(n=Count("pk")).order_by())
    return _grouped_rows(exact.values_list(*rule_fields, "created_at", "decided_at"))


def _grouped_rows(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """_exact_groups from rows (agent id, origin, index, decided by, status, created,
    decided) read back."""
    groups: dict[tuple[Any, ...], int] = {}
    for *key, created, decided in rows:
        start = _day_start(decided.astimezone(dt.UTC).date())
        k = (*key, start, review_tally.bucket_of((decided - created).total_seconds()))
        groups[k] = groups.get(k, 0) + 1
    return [(*k, n) for k, n in groups.items()]


@dataclass(frozen=True)
class Untallied:
    """A closed call not folded yet, as the page reads it once for the window's exact
    part and for the fatigue streaks (both add these to what the fold kept)."""

    pk: int
    agent_id: int
    origin: str | None
    index: str | None
    decided_at: dt.datetime
    kind: str
    tool: str
    round: int
    risk: str
    required: int
    status: str
    decided_by_id: int | None
    created_at: dt.datetime


# _untallied over every call, written out (PostgreSQL): its rows are those of the
# queryset below, which cost more to build each load than to run (50 calls: 0.8 ms).
_UNTALLIED_SQL = f"""
    SELECT a.id, (SELECT r.profile_id FROM agents_run r WHERE r.id = a.run_id), a.rule ->> 'origin', a.rule ->> 'index',
           a.decided_at, a.kind, a.tool, a.round, a.risk, a.required, a.status, a.decided_by_id, a.created_at
    FROM agents_approval a
    WHERE a.decided_at IS NOT NULL AND a.decided_at <= %s AND a.status IN ({", ".join(f"'{c}'" for c in CLOSED)})
          AND NOT a.tallied
    ORDER BY a.decided_at DESC, a.id DESC LIMIT %s
"""


def _untallied(approvals: QuerySet[Approval], now: dt.datetime) -> list[Untallied] | None:
    """The closed calls among `approvals` not folded yet, newest first; None when there
    are more than FATIGUE_SCAN (no sweeper yet), which the page's parts then count or
    walk each their own way."""
    if _written_out(approvals):
        with connections[approvals.db].cursor() as cur:
            cur.execute(_UNTALLIED_SQL, [now, FATIGUE_SCAN + 1])
            rows = list(cur.fetchall())
    else:
        rows = list(
            approvals.filter(status__in=CLOSED, tallied=False, decided_at__isnull=False, decided_at__lte=now)
            .order_by("-decided_at", "-pk").annotate(s_agent_id=AGENT_ID)
            .values_list("pk", "s_agent_id", KT("rule__origin"), KT("rule__index"), "decided_at", "kind", "tool",
                         "round", "risk", "required", "status", "decided_by_id", "created_at")[: FATIGUE_SCAN + 1]
        )
    return None if len(rows) > FATIGUE_SCAN else [Untallied(*r) for r in rows]


def _hist_timing(hist: dict[int, int]) -> Timing:
    n = sum(hist.values())
    if not n:
        return Timing()
    p50, p95 = review_tally.percentiles(hist, (0.5, 0.95))
    return Timing(n, p50, p95)


def window_figures(window: QuerySet[Approval], *, days: int, in_database: bool | None = None) -> WindowFigures:
    bucket = Trunc("decided_at", "hour" if days == 1 else "day", tzinfo=dt.UTC)
    agent = AGENT if days <= SHORT_WINDOW_DAYS else AGENT_JOINED
    if in_database is None:
        in_database = connections[window.db].vendor == "postgresql"
    return _window_grouped(window, bucket, agent) if in_database else _window_orm(window, bucket, agent)


def _chart(times: dict[dt.datetime, Timing], *, since: dt.datetime, now: dt.datetime, hourly: bool) -> Chart:
    step = dt.timedelta(hours=1) if hourly else dt.timedelta(days=1)
    start = since.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    if not hourly:
        start = start.replace(hour=0)
    buckets = []
    while start <= now:
        buckets.append(Bucket(start, times.get(start, Timing())))
        start += step
    return Chart(buckets, hourly)


def _streak_scope(user: Any) -> tuple[str, list[int]] | None:
    """Which folded streaks `user` may read, by profile (a condition on ReviewStreak's
    columns and its parameters), or None when only the calls themselves can answer: a
    launcher (who sees their own runs' calls) and a backup reviewer (who sees a
    profile's escalated calls only) walk them."""
    if access.reads_all_runs(user):
        return "TRUE", []
    scope = access.review_scope(user)
    if scope.empty or scope.backup or access.in_group(user, access.LAUNCHER):
        return None
    if scope.everything:
        return "TRUE", []
    primary = sorted(scope.primary)
    return f"profile_id IN ({placeholders(primary)})", primary


# The folded streaks and the reviewers' names, read on every load: written out
# (agents/lib/rows.py), as querysets they cost more to build than to run.
_STREAK_FIELDS = (
    "profile_id", "tool", "origin", "index", "length", "irreversible", "votes", "broken_at", "broken_id", "last_at",
    "last_id",
)


@functools.cache
def _streak_rows() -> Rows:
    return Rows(ReviewStreak, _STREAK_FIELDS)


@functools.cache
def _user_rows() -> Rows:
    return Rows(get_user_model(), ("id", "username"))


def _usernames(ids: Iterable[int | None]) -> dict[int, str]:
    """The names of the users `ids` (0 and None, no one, left out)."""
    wanted = sorted({i for i in ids if i})
    if not wanted:
        return {}
    return {r.id: r.username for r in _user_rows().fetch(f"id IN ({placeholders(wanted)})", wanted, order_by="id")}


def _fatigue(
    approvals: QuerySet[Approval], profiles: list[AgentProfile], *, user: Any, now: dt.datetime, needed: int,
    untallied: list[Untallied] | None,
) -> list[Streak]:
    """Each (profile, tool, rule) whose latest `needed` or more closed calls were all
    approved as proposed, longest first (a reject, an edit or an expiry ends a streak),
    its newest call closed in the last FATIGUE_DAYS.

    1. The streaks folded ahead (ReviewStreak, by the sweeper's fold), with the calls
       closed since the last fold folded onto them here (agents/engine/streaks.py).
       As the tallies, the two are separate statements: a fold committed between them
       can make one page count a call twice or not at all; the next one is right.
    2. One statement per streak long enough for the arguments it is drafted from.

    More calls closed since the last fold than FATIGUE_SCAN (no sweeper yet: `untallied`
    is None), and a viewer the folded streaks cannot answer for, walk the calls instead
    (_walked)."""
    scope = _streak_scope(user)
    if scope is None or untallied is None:
        return _walked(approvals, profiles, now=now, needed=needed)
    fresh = [
        (u.pk, u.agent_id, u.origin, u.index, u.decided_at, u.kind, u.tool, u.round, u.risk, u.required, u.status)
        for u in untallied if u.kind == decisions.POLICY
    ]
    where, params = scope
    folded = {
        (r.profile_id, r.tool, r.origin, r.index): review_tally.streak_of(r)
        for r in _streak_rows().fetch(where, params, order_by="id")
    }
    calls: dict[review_tally.StreakKey, list[streaks.Call]] = {}
    for row in fresh:
        found = review_tally.streak_call(*row)
        if found is not None:
            calls.setdefault(found[0], []).append(found[1])
    for key, more in calls.items():
        recount = functools.partial(review_tally.recount, key)
        folded[key] = streaks.fold(folded.get(key, streaks.Streak()), more, recount)
    recent = now - dt.timedelta(days=FATIGUE_DAYS)
    by_id = {p.pk: p for p in profiles}
    out = []
    for key, s in folded.items():
        if s.length < needed or s.last is None or s.last[0] < recent or key[0] not in by_id:
            continue
        args: list[Any] = []
        if not s.irreversible and s.votes <= 1:
            args = list(
                review_tally.streak_calls(key, s.broken, approvals).filter(decided_at__lte=now)
                .order_by("-decided_at", "-pk").values_list("args", flat=True)[:DRAFT_SAMPLE]
            )
        profile_id, tool, origin, index = key
        out.append(_shown(by_id[profile_id], tool, origin or None, index if origin else None, s, args))
    return sorted(out, key=lambda s: (-s.length, s.agent.name, s.tool, s.origin or "", s.index or 0))


def _shown(
    agent: AgentProfile, tool: str, origin: str | None, index: int | None, s: streaks.Streak, args: list[Any]
) -> Streak:
    """The page's streak, with its draft or why none is offered (`args`: the newest
    calls' arguments, for a streak that may have a draft)."""
    streak = Streak(agent, tool, origin, index, s.length)
    if s.irreversible:
        streak.refusal = "irreversible calls are approved one at a time: no draft is offered"
    elif s.votes > 1:
        streak.refusal = "these calls need several votes: a rule that lets them through is not drafted"
    else:
        reason = f"drafted from {s.length} calls approved unchanged in a row; review before use"
        streak.draft = drafts.narrower_allow(tool, args, reason=reason)
        if streak.draft is None:
            streak.refusal = "no argument of these calls can be bounded by the values seen: no draft"
    return streak


def _walked(approvals: QuerySet[Approval], profiles: list[AgentProfile], *, now: dt.datetime, needed: int) -> list[Streak]:
    """_fatigue's answer from the calls themselves, without the folded streaks:

    1. The newest FATIGUE_SCAN closed policy calls, newest first (the `approval_decided`
       index): walking them, each key's streak grows until its first call that breaks it.
    2. One more statement for the arguments of the streaks long enough (the newest
       DRAFT_SAMPLE of each), from which the drafts are made.

    Launch rules are left out: they come before the profile's, so no profile rule could
    answer the calls they ask about.
    """
    recent = approvals.filter(
        kind=decisions.POLICY, status__in=CLOSED, decided_at__gte=now - dt.timedelta(days=FATIGUE_DAYS),
        decided_at__lte=now,
    ).order_by("-decided_at", "-pk").annotate(s_agent_id=AGENT_ID)
    rows = recent.values_list(
        "pk", "s_agent_id", "tool", KT("rule__origin"), KT("rule__index"), "status", "round", "risk", "required"
    )[:FATIGUE_SCAN]
    walks: dict[tuple[Any, ...], _Walk] = {}
    for pk, agent_id, tool, origin, index, status, round_, risk, required in rows:
        if origin == "launch":
            continue
        walk = walks.setdefault((agent_id, tool, origin, None if index is None else int(index)), _Walk())
        if walk.broken:
            continue
        if status == decisions.APPROVED and round_ == 0:
            walk.length += 1
            walk.irreversible |= risk == "irreversible"
            walk.votes = max(walk.votes, required)
            if len(walk.ids) < DRAFT_SAMPLE:
                walk.ids.append(pk)
        else:
            walk.broken = True
    long_enough = {key: w for key, w in walks.items() if w.length >= needed}
    wanted = [pk for w in long_enough.values() if not w.irreversible and w.votes <= 1 for pk in w.ids]
    args = dict(Approval.objects.filter(pk__in=wanted).values_list("pk", "args")) if wanted else {}
    by_id = {p.pk: p for p in profiles}
    out = [
        _shown(by_id[agent_id], tool, origin, index, streaks.Streak(w.length, w.irreversible, w.votes),
               [args[pk] for pk in w.ids if pk in args])
        for (agent_id, tool, origin, index), w in long_enough.items()
    ]
    return sorted(out, key=lambda s: (-s.length, s.agent.name, s.tool, s.origin or "", s.index or 0))


@dataclass
class _Walk:
    length: int = 0
    broken: bool = False
    irreversible: bool = False
    votes: int = 1
    ids: list[int] = field(default_factory=list)


def _shadow(
    profiles: list[AgentProfile], days: int, now: dt.datetime
) -> list[tuple[AgentProfile, list[backtest.Agreement]]]:
    """Each profile with shadow rules: their agreement with reviewers over the window."""
    out = []
    for profile in profiles:
        if any(isinstance(r, dict) and r.get("mode") == engine_policy.SHADOW for r in profile.rules or ()):
            out.append((profile, backtest.shadow_agreement(profile, days=days, now=now)))
    return out


_PROFILES = Joined(AgentProfile, (), "TRUE ORDER BY a.name")  # every profile, written out (agents/lib/rows.py)


def stats(user: Any, *, days: int, now: dt.datetime | None = None, in_database: bool | None = None) -> Stats:
    """Every figure of the page, for what `user` may see, over the last `days` (until
    `now`, by default the present)."""
    present = now is None
    now = now or timezone.now()
    since = now - dt.timedelta(days=days)
    approvals = access.visible_approvals(user)
    oldest = _oldest(approvals)
    window = approvals.filter(decided_at__gte=since, decided_at__lte=now)
    hourly = days == 1
    # Over whole days the tallies answer (a day's figures are folded once); the hourly
    # chart of one day and a window nothing was folded for are computed exactly.
    profiles = _PROFILES.fetch(())
    names = {p.pk: p.name for p in profiles}
    version = review_tally.version()  # before anything it names is read: see _past_sums
    untallied = _untallied(approvals, now)
    tallied = None if hourly or in_database is not None else _window_tallied(
        window, user, names, version, since=since, now=now, present=present, untallied=untallied,
        every_call=_every_call(approvals),
    )
    figures = tallied or window_figures(window, days=days, in_database=in_database)
    escalations, lapsed = _events(user, approvals, names, version, since=since, now=now)
    needed = settings.AIRLOCK_FATIGUE_STREAK
    return Stats(
        days=days,
        since=since,
        now=now,
        pending=oldest.waiting if oldest else 0,
        oldest=oldest,
        overall=figures.overall,
        reviewers=figures.reviewers,
        agents=figures.agents,
        rules=figures.rules,
        escalations=escalations,
        lapsed=lapsed,
        chart=_chart(figures.buckets, since=since, now=now, hourly=hourly),
        shadow=_shadow(profiles, days, now),
        fatigue=_fatigue(approvals, profiles, user=user, now=now, needed=needed, untallied=untallied),
        streak_needed=needed,
        bucketed=tallied is not None,
    )
