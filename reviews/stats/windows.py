"""The window (`?days=`) and its figures computed exactly over the approvals decided in it:
in the database with GROUPING SETS on PostgreSQL, through the ORM elsewhere.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Trunc

from agents.engine import decisions
from agents.lib.rows import Rows, placeholders
from agents.models import Approval, Run
from agents.ops import review_tally

from .figures import ReviewerRow, RuleRow
from .timing import BucketOf, Seconds, Timing, timings

WINDOWS = (1, 7, 30, 90)
DEFAULT_DAYS = 7
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


def every_call(approvals: QuerySet[Approval]) -> bool:
    """Whether `approvals` (access.visible_approvals of the viewer) is every call: no
    visibility rule narrows it, so the page's written-out reads of all calls serve it."""
    return not approvals.query.where


def written_out(approvals: QuerySet[Approval]) -> bool:
    """Whether the written-out PostgreSQL reads of every call answer for `approvals`."""
    return every_call(approvals) and connections[approvals.db].vendor == "postgresql"


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


def rule_row(agent: str, origin: str | None, index: Any, approved: int, rejected: int, expired: int, timing: Timing) -> RuleRow:
    return RuleRow(agent, origin, int(index) if index is not None else None, approved, rejected, expired, timing)


def sorted_figures(figures: WindowFigures) -> WindowFigures:
    figures.agents.sort(key=lambda a: a[0])
    figures.rules.sort(key=lambda row: (row.agent, row.origin or "~", row.index or 0))
    figures.reviewers.sort(key=lambda r: r.name)
    return figures


def _window_orm(window: QuerySet[Approval], bucket: Any, agent: Any) -> WindowFigures:
    """One aggregate per figure, through `timings` (SQLite's way)."""
    closed = window.filter(status__in=review_tally.CLOSED)
    keys = _rule_keys(agent)
    counted = closed.values(**keys).annotate(
        approved=Count("pk", filter=Q(status=decisions.APPROVED)),
        rejected=Count("pk", filter=Q(status=decisions.REJECTED)),
        expired=Count("pk", filter=Q(status=decisions.EXPIRED)),
    ).order_by()
    times = timings(window, keys)
    rules = [
        rule_row(r["agent"], r["origin"], r["index"], r["approved"], r["rejected"], r["expired"],
                  times.get((r["agent"], r["origin"], r["index"]), Timing()))
        for r in counted
    ]
    reviewers = [
        ReviewerRow(r["name"] or "(deleted user)", r["approved"], r["rejected"])
        for r in window.filter(status__in=review_tally.PEOPLE).values(name=F("decided_by__username")).annotate(
            approved=Count("pk", filter=Q(status=decisions.APPROVED)),
            rejected=Count("pk", filter=Q(status=decisions.REJECTED)),
        ).order_by()
    ]
    return sorted_figures(WindowFigures(
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
    inner = window.filter(status__in=review_tally.CLOSED).annotate(
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
                figures.rules.append(rule_row(agent, origin, idx, approved, rejected, expired, timing))
            elif g == _BY_AGENT and n:
                figures.agents.append((agent, timing))
            elif g == _OVERALL:
                figures.overall = timing
            elif g == _BY_REVIEWER and n:
                figures.reviewers.append(ReviewerRow(who or "(deleted user)", approved, rejected))
            elif g == _BY_BUCKET and n:
                # A raw cursor skips the ORM's converters: date_trunc's timestamp is UTC.
                figures.buckets[at if at.tzinfo else at.replace(tzinfo=dt.UTC)] = timing
    return sorted_figures(figures)


def day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


def exact_groups(exact: QuerySet[Approval]) -> list[tuple[Any, ...]]:
    """The calls of `exact` counted per rule, reviewer, status, UTC day and bucket: in
    PostgreSQL (a partial day is thousands of calls, their groups far fewer); on SQLite,
    which may have no logarithm, from the rows read back."""
    rule_fields = ("s_agent_id", "s_origin", "s_index", "decided_by_id", "status")
    if connections[exact.db].vendor == "postgresql":
        # The bucket of an expiry is ignored: it has no time to decision.
        day = Trunc("decided_at", "day", tzinfo=dt.UTC)
        return list(exact.values_list(*rule_fields, day, BucketOf()).annotate(n=Count("pk")).order_by())
    return grouped_rows(exact.values_list(*rule_fields, "created_at", "decided_at"))


def grouped_rows(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """exact_groups from rows (agent id, origin, index, decided by, status, created,
    decided) read back."""
    groups: dict[tuple[Any, ...], int] = {}
    for *key, created, decided in rows:
        start = day_start(decided.astimezone(dt.UTC).date())
        k = (*key, start, review_tally.bucket_of((decided - created).total_seconds()))
        groups[k] = groups.get(k, 0) + 1
    return [(*k, n) for k, n in groups.items()]


def window_figures(window: QuerySet[Approval], *, days: int, in_database: bool | None = None) -> WindowFigures:
    bucket = Trunc("decided_at", "hour" if days == 1 else "day", tzinfo=dt.UTC)
    agent = AGENT if days <= SHORT_WINDOW_DAYS else AGENT_JOINED
    if in_database is None:
        in_database = connections[window.db].vendor == "postgresql"
    return _window_grouped(window, bucket, agent) if in_database else _window_orm(window, bucket, agent)


@functools.cache
def _user_rows() -> Rows:
    return Rows(get_user_model(), ("id", "username"))


def usernames(ids: Iterable[int | None]) -> dict[int, str]:
    """The names of the users `ids` (0 and None, no one, left out)."""
    wanted = sorted({i for i in ids if i})
    if not wanted:
        return {}
    return {r.id: r.username for r in _user_rows().fetch(f"id IN ({placeholders(wanted)})", wanted, order_by="id")}
