"""The window's figures from the daily tallies the sweeper folds (agents/ops/review_tally.py)
for its whole days, the approvals themselves for its partial days and for the calls not
folded yet, and the past days' sums kept in the cache.
"""

from __future__ import annotations

import array
import bisect
import datetime as dt
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import connections
from django.db.models import Q, QuerySet, Sum
from django.db.models.fields.json import KT
from django.utils import timezone

from agents import access
from agents.models import Approval, ReviewTally, ReviewTiming
from agents.ops import review_tally

from .fatigue import Untallied
from .figures import ReviewerRow, RuleRow
from .timing import Timing, hist_timing
from .windows import AGENT_ID, WindowFigures, day_start, exact_groups, grouped_rows, rule_row, sorted_figures, usernames


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


def fresh_from() -> dt.date:
    """The first UTC day the page reads fresh (yesterday): the days before are cached."""
    return timezone.now().astimezone(dt.UTC).date() - dt.timedelta(days=1)


def past_sums(
    scope: _TallyScope, version: int, profiles: Sequence[int], first: dt.date, until: dt.date
) -> _Sums:
    """_tallied_sums of days before yesterday, through the Django cache, keyed by the
    tallies' `version` (which the fold bumps, in its transaction, when it adds to a day
    before its own; it adds to yesterday without, hence yesterday is read fresh), read
    before the tallies, so an entry never holds less than its version. The profiles
    are in the key: deleting one deletes its tallies."""
    def summed() -> _Sums:
        sums = _tallied_sums(scope, first, until)
        sums.day_timing = {day: hist_timing(h) for day, h in sums.day_hist.items()}
        return sums

    return kept("past", f"{version}:{scope.key}:{list(profiles)}:{first}:{until}", _Sums, summed)


def kept(kind: str, named: str, of_type: type[T], compute: Callable[[], T]) -> T:
    """`compute()` through the Django cache, for PAST_CACHE_SECONDS, under `kind` and the
    hash of `named` (everything the entry depends on)."""
    key = f"reviews.stats.{kind}:" + hashlib.sha256(named.encode()).hexdigest()
    found = cache.get(key)
    if isinstance(found, of_type):
        return found
    found = compute()
    cache.set(key, found, PAST_CACHE_SECONDS)
    return found


def window_tallied(
    window: QuerySet[Approval], user: Any, names: dict[int, str], version: int, *, since: dt.datetime,
    now: dt.datetime, present: bool = False, untallied: list[Untallied] | None = None, every_call: bool = False,
) -> WindowFigures | None:
    """The window's figures from the daily tallies for its whole UTC days and from the
    approvals themselves for its two partial days and for calls not yet folded; the
    percentiles from log-spaced buckets (within review_tally.MAX_ERROR). None when the
    tallies hold nothing for those days or cannot answer for `user`.

    The days before yesterday are summed once per version of the tallies (past_sums);
    yesterday and today are read fresh.

    The partial first day, when it is before yesterday, the page has read the calls not
    folded yet (`untallied`) and the viewer sees every call (`every_call`), is cut from
    that day's folded calls kept once per version (_past_calls) instead of read.

    `present`: `now` is the present, so today's tally holds only calls closed before it
    and reads today too (a `now` in the past reads today exactly). `names`: every
    profile's, by id; `version`: the tallies', read before them (review_tally.version);
    `untallied`: the calls not folded yet, when the page read them (untallied_calls)."""
    scope = _tally_scope(user)
    first = since.astimezone(dt.UTC).date() + dt.timedelta(days=1)
    end = now.astimezone(dt.UTC).date()
    if scope is None or first >= end:
        return None
    until = end + dt.timedelta(days=1) if present else end  # the tallied days end before it
    cached = min(until, fresh_from())
    sums = past_sums(scope, version, sorted(names), first, cached) if cached > first else _Sums()
    if until > max(first, cached):
        sums.add(_tallied_sums(scope, max(first, cached), until))
    if not sums.counts:
        return None  # nothing folded for those days: the exact figures
    counts, rule_hist, day_timing = sums.counts, sums.rule_hist, sums.day_timing
    day_hist = {day_start(day): h for day, h in sums.day_hist.items()}
    # The exact part: the partial days (the first; today unless `present`), and whatever
    # is not folded yet.
    # Each range its own statement: one statement with an OR over them read the whole
    # window through the index and was costed high enough to be JIT-compiled (37 of its
    # 60 ms over a week in bench/stats.py).
    whole_days = (day_start(first), day_start(until))
    since_day = first - dt.timedelta(days=1)
    kept_first = bool(version) and every_call and untallied is not None and since_day < fresh_from()
    parts = [] if kept_first else [Q(decided_at__lt=whole_days[0])]
    if untallied is None:
        parts.append(Q(decided_at__gte=whole_days[0], decided_at__lt=whole_days[1], tallied=False))
    if not present:
        parts.append(Q(decided_at__gte=day_start(end)))
    groups: list[Any] = []
    for part in parts:  # none, mostly: no queryset is built for nothing
        groups.extend(exact_groups(window.filter(part, status__in=review_tally.CLOSED).annotate(
            s_agent_id=AGENT_ID, s_origin=KT("rule__origin"), s_index=KT("rule__index")
        )))
    if kept_first:
        groups.extend(_past_calls(version, sorted(names), since_day).since(since))
    if untallied is not None:  # the calls not folded yet, read once for the page
        start = since if kept_first else whole_days[0]
        groups.extend(grouped_rows(
            (u.agent_id, u.origin, u.index, u.decided_by_id, u.status, u.created_at, u.decided_at)
            for u in untallied if start <= u.decided_at < whole_days[1]
        ))
    for pid, origin, index, by, status, day, b, n in groups:
        rule = (pid, origin or "", int(index) if index is not None else 0)
        key = (*rule, by or 0, status)
        counts[key] = counts.get(key, 0) + n
        if status in review_tally.PEOPLE:
            h = rule_hist.setdefault(rule, {})
            h[b] = h.get(b, 0) + n
            d = day_hist.setdefault(day.astimezone(dt.UTC), {})
            d[b] = d.get(b, 0) + n
            day_timing.pop(day.astimezone(dt.UTC).date(), None)
    people = usernames(k[3] for k in counts)
    rules: dict[tuple[Any, ...], RuleRow] = {}
    reviewers: dict[str, ReviewerRow] = {}
    agent_hist: dict[str, dict[int, int]] = {}
    for (pid, origin, index, by, status), n in counts.items():
        row = rules.setdefault((pid, origin, index), rule_row(names[pid], origin or None, index if origin else None, 0, 0, 0, Timing()))
        setattr(row, status, getattr(row, status) + n)
        if status in review_tally.PEOPLE:
            who = people.get(by) or "(deleted user)"
            rr = reviewers.setdefault(who, ReviewerRow(who, 0, 0))
            setattr(rr, status, getattr(rr, status) + n)
    overall: dict[int, int] = {}
    for (pid, origin, index), h in rule_hist.items():
        rules[(pid, origin, index)].timing = hist_timing(h)
        a = agent_hist.setdefault(names[pid], {})
        for b, n in h.items():
            a[b] = a.get(b, 0) + n
            overall[b] = overall.get(b, 0) + n
    return sorted_figures(WindowFigures(
        overall=hist_timing(overall),
        agents=[(name, hist_timing(h)) for name, h in agent_hist.items()],
        rules=list(rules.values()),
        reviewers=list(reviewers.values()),
        buckets={at: day_timing.get(at.date()) or hist_timing(h) for at, h in day_hist.items()},
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
        """exact_groups' rows of the calls decided at `start` or after it."""
        counted = Counter(self.group[bisect.bisect_left(self.at, _micros(start)):])
        day = day_start(self.day)
        return [(*self.groups[g][:5], day, self.groups[g][5], n) for g, n in counted.items()]


def _past_calls(version: int, profiles: Sequence[int], day: dt.date) -> _DayCalls:
    """The closed calls of `day` (before yesterday) that the fold has counted, of every
    call, through the Django cache (the tallies' `version` and the profiles in the key,
    as past_sums), for the window's partial first day: a folded call of a day before
    yesterday never changes, a call folded into it later bumps the version, and one not
    folded yet is among the page's `untallied`. Each call's bucket is the fold's own
    (review_tally.bucket_of)."""
    def read() -> _DayCalls:
        calls = _DayCalls(day)
        places: dict[tuple[Any, ...], int] = {}
        rows = (
            Approval.objects.filter(
                status__in=review_tally.CLOSED, tallied=True, decided_at__gte=day_start(day),
                decided_at__lt=day_start(day + dt.timedelta(days=1)),
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

    return kept("calls", f"{version}:{list(profiles)}:{day}", _DayCalls, read)
