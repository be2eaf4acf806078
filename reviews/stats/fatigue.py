"""Approval fatigue: streaks of calls approved unchanged in a row (folded ahead by the
sweeper, agents/engine/streaks.py) and the narrower allow rule drafted from them
(agents/engine/drafts.py); the closed calls not folded yet, read once for the page.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import QuerySet
from django.db.models.fields.json import KT

from agents import access
from agents.engine import decisions, drafts, streaks
from agents.lib.rows import Rows, placeholders
from agents.models import AgentProfile, Approval, ReviewStreak
from agents.ops import review_tally

from .figures import Streak
from .windows import AGENT_ID, WINDOWS, written_out

# A streak is shown while its newest call closed in the last FATIGUE_DAYS. The folded
# streaks count every call; where the calls are walked instead (_walked), the newest
# FATIGUE_SCAN are read, so the walk stays bounded however much history there is.
FATIGUE_DAYS = max(WINDOWS)
FATIGUE_SCAN = 5000
DRAFT_SAMPLE = 1000  # the newest approved calls of a streak a draft is derived from
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


# untallied_calls over every call, written out (PostgreSQL): its rows are those of the
# queryset below, which cost more to build each load than to run (50 calls: 0.8 ms).
_UNTALLIED_SQL = f"""
    SELECT a.id, (SELECT r.profile_id FROM agents_run r WHERE r.id = a.run_id), a.rule ->> 'origin', a.rule ->> 'index',
           a.decided_at, a.kind, a.tool, a.round, a.risk, a.required, a.status, a.decided_by_id, a.created_at
    FROM agents_approval a
    WHERE a.decided_at IS NOT NULL AND a.decided_at <= %s AND a.status IN ({", ".join(f"'{c}'" for c in review_tally.CLOSED)})
          AND NOT a.tallied
    ORDER BY a.decided_at DESC, a.id DESC LIMIT %s
"""


def untallied_calls(approvals: QuerySet[Approval], now: dt.datetime) -> list[Untallied] | None:
    """The closed calls among `approvals` not folded yet, newest first; None when there
    are more than FATIGUE_SCAN (no sweeper yet), which the page's parts then count or
    walk each their own way."""
    if written_out(approvals):
        with connections[approvals.db].cursor() as cur:
            cur.execute(_UNTALLIED_SQL, [now, FATIGUE_SCAN + 1])
            rows = list(cur.fetchall())
    else:
        rows = list(
            approvals.filter(status__in=review_tally.CLOSED, tallied=False, decided_at__isnull=False, decided_at__lte=now)
            .order_by("-decided_at", "-pk").annotate(s_agent_id=AGENT_ID)
            .values_list("pk", "s_agent_id", KT("rule__origin"), KT("rule__index"), "decided_at", "kind", "tool",
                         "round", "risk", "required", "status", "decided_by_id", "created_at")[: FATIGUE_SCAN + 1]
        )
    return None if len(rows) > FATIGUE_SCAN else [Untallied(*r) for r in rows]


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


def fatigue_streaks(
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
    """fatigue_streaks's answer from the calls themselves, without the folded streaks:

    1. The newest FATIGUE_SCAN closed policy calls, newest first (the `approval_decided`
       index): walking them, each key's streak grows until its first call that breaks it.
    2. One more statement for the arguments of the streaks long enough (the newest
       DRAFT_SAMPLE of each), from which the drafts are made.

    Launch rules are left out: they come before the profile's, so no profile rule could
    answer the calls they ask about.
    """
    recent = approvals.filter(
        kind=decisions.POLICY, status__in=review_tally.CLOSED, decided_at__gte=now - dt.timedelta(days=FATIGUE_DAYS),
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
