"""Every figure of `/reviews/stats/` for one viewer: `stats()`, the oldest waiting call,
the chart's buckets and shadow rules' agreement.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import Count, QuerySet, Window
from django.utils import timezone

from agents import access
from agents.engine import decisions
from agents.engine import policy as engine_policy
from agents.lib.rows import Joined
from agents.models import AgentProfile, Approval
from agents.ops import review_tally
from agents.runs import backtest

from .events import escalated_and_lapsed
from .fatigue import fatigue_streaks, untallied_calls
from .figures import Bucket, Chart, Oldest, Stats
from .tallied import window_tallied
from .timing import Timing
from .windows import every_call, window_figures, written_out

# _oldest over every call, written out (PostgreSQL): the page reads it on every load,
# and the queryset cost more to build than to run.
_OLDEST_SQL = """
    SELECT a.id, a.tool, a.created_at, p.name, COUNT(a.id) OVER () FROM agents_approval a
    JOIN agents_run r ON r.id = a.run_id JOIN agents_agentprofile p ON p.id = r.profile_id
    WHERE a.status = %s ORDER BY a.created_at, a.id LIMIT 1
"""


def _oldest(approvals: QuerySet[Approval]) -> Oldest | None:
    """The oldest pending call among `approvals` and, beside it, how many wait: one
    statement."""
    if written_out(approvals):
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
    version = review_tally.version()  # before anything it names is read: see past_sums
    untallied = untallied_calls(approvals, now)
    tallied = None if hourly or in_database is not None else window_tallied(
        window, user, names, version, since=since, now=now, present=present, untallied=untallied,
        every_call=every_call(approvals),
    )
    figures = tallied or window_figures(window, days=days, in_database=in_database)
    escalations, lapsed = escalated_and_lapsed(user, approvals, names, version, since=since, now=now)
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
        fatigue=fatigue_streaks(approvals, profiles, user=user, now=now, needed=needed, untallied=untallied),
        streak_needed=needed,
        bucketed=tallied is not None,
    )
