"""Escalations per agent and lapsed claims per claimant in the window.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Count, Q, QuerySet

from agents import access
from agents.models import Approval, ApprovalClaim

from .tallied import fresh_from, kept
from .windows import AGENT_ID, day_start, every_call, written_out


def escalated_and_lapsed(
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
    cutoff = min(now.astimezone(dt.UTC).date(), fresh_from())
    # A version exists once the fold has written one: a database emptied since (a test's
    # flush) has none, so no entry of its earlier contents can be read back.
    if version and every_call(approvals) and cutoff > first:
        esc, lapsed = _past_events(version, sorted(names), first, cutoff)
        ends = [(since, day_start(first), False), (day_start(cutoff), now, True)]
    else:
        esc, lapsed = {}, {}
        ends = [(since, now, True)]
    if written_out(approvals):
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
    `version` and the profiles in the key, as past_sums)."""
    start, end = day_start(first), day_start(until)

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

    return kept("events", f"{version}:{list(profiles)}:{first}:{until}", tuple, counted)
