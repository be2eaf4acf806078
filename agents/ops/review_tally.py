"""The review statistics' daily tallies: closed calls folded into counts per UTC day,
agent, rule, escalated or not, reviewer and status, and time to decision as counts per
log-spaced bucket (`/reviews/stats/` reads them for the whole days of its window); and
approval fatigue's streaks per agent, tool and rule (ReviewStreak, agents/engine/streaks.py).

Each closed approval is folded once, whenever its decision is committed: the fold takes
the approvals not yet `tallied` (locked, skipping those another folder holds), marks
them and adds their counts in the same transaction. The sweeper folds on each pass.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
import time
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.db.models.fields.json import KT
from django.utils import timezone

from agents.engine import decisions, streaks
from agents.models import Approval, ReviewStreak

PEOPLE = (decisions.APPROVED, decisions.REJECTED)
CLOSED = (*PEOPLE, decisions.EXPIRED)
PER_DOUBLING = 8  # buckets per doubling of the wait: each spans a factor 2 ** (1/8)
MIN_SECONDS = 0.001  # shorter waits share the lowest bucket
# A bucket's value is its geometric middle, so a percentile read from buckets is within
# this factor of the exact one (both ranks it interpolates between are).
MAX_ERROR = 2 ** (1 / (2 * PER_DOUBLING)) - 1
FOLD_BATCH = 5000


def bucket_of(seconds: float) -> int:
    return math.floor(PER_DOUBLING * math.log2(max(seconds, MIN_SECONDS)))


def bucket_seconds(bucket: int) -> float:
    return float(2 ** ((bucket + 0.5) / PER_DOUBLING))


def percentile(hist: dict[int, int], fraction: float) -> float | None:
    """`percentile_cont` over the bucket counts `hist`: the ranks it interpolates between
    are read as their buckets' middles."""
    return percentiles(hist, (fraction,))[0]


def percentiles(hist: dict[int, int], fractions: Sequence[float]) -> list[float | None]:
    """`percentile` at each of `fractions`, from one running sum over the sorted buckets
    searched for each rank (the page reads p50 and p95 of a hundred histograms)."""
    n = sum(hist.values())
    if not n:
        return [None] * len(fractions)
    wanted = [(pos, math.floor(pos), math.ceil(pos)) for pos in (f * (n - 1) for f in fractions)]
    buckets = sorted(hist)
    reached = list(itertools.accumulate(map(hist.__getitem__, buckets)))  # the ranks each bucket ends before
    values: dict[int, float] = {}
    for rank in {rank for _, low, high in wanted for rank in (low, high)}:
        # A rank is in the first bucket reaching past it.
        values[rank] = bucket_seconds(buckets[bisect.bisect_right(reached, rank)])
    return [values[low] + (values[high] - values[low]) * (pos - low) for pos, low, high in wanted]


class _Lost(Exception):
    """Another folder marked some of this batch between our read and our write."""


def approvals_tally(*, batch: int = FOLD_BATCH) -> int:
    """Fold every closed approval not yet tallied; returns how many were folded."""
    folded = 0
    while True:
        try:
            n = _fold(batch)
        except _Lost:
            return folded  # the other folder counts those
        folded += n
        if n < batch:
            return folded


def _fold(batch: int) -> int:
    """One batch, in one transaction:

    1. Lock up to `batch` untallied closed approvals, skipping rows another folder has
       locked (PostgreSQL; SQLite has one writer at a time).
    2. Mark them tallied; if fewer rows changed than were read, another folder took
       some first (possible on SQLite between read and write): roll back, it counts them.
    3. Add their counts to the tallies with one upsert per key, keys in a fixed order
       so two folders never wait on each other's rows crosswise.
    """
    today = timezone.now().astimezone(dt.UTC).date()  # before the rows: the earliest it can be
    with transaction.atomic():
        rows = list(
            Approval.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(tallied=False, decided_at__isnull=False, status__in=CLOSED)
            .order_by("decided_at", "pk")
            .values_list(
                "pk", "run__profile_id", KT("rule__origin"), KT("rule__index"), "escalated_at", "decided_by_id",
                "status", "created_at", "decided_at", "kind", "tool", "round", "risk", "required",
            )[:batch]
        )
        if not rows:
            return 0
        ids = [r[0] for r in rows]
        if Approval.objects.filter(pk__in=ids, tallied=False).update(tallied=True) != len(ids):
            raise _Lost
        counts: Counter[tuple[Any, ...]] = Counter()
        times: Counter[tuple[Any, ...]] = Counter()
        for _, profile_id, origin, index, escalated_at, by, status, created, decided, *_call in rows:
            day = decided.astimezone(dt.UTC).date()
            rule = (origin or "", int(index) if index is not None else 0)
            esc = escalated_at is not None
            counts[(day, profile_id, *rule, esc, by or 0, status)] += 1
            if status in PEOPLE:
                times[(day, profile_id, *rule, esc, bucket_of((decided - created).total_seconds()))] += 1
        with connection.cursor() as cur:
            cur.executemany(
                """INSERT INTO agents_reviewtally (day, profile_id, origin, "index", escalated, reviewer, status, n)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (day, profile_id, origin, "index", escalated, reviewer, status)
                   DO UPDATE SET n = agents_reviewtally.n + EXCLUDED.n""",
                [(*k, n) for k, n in sorted(counts.items())],
            )
            cur.executemany(
                """INSERT INTO agents_reviewtiming (day, profile_id, origin, "index", escalated, bucket, n)
                   VALUES (%s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (day, profile_id, origin, "index", escalated, bucket)
                   DO UPDATE SET n = agents_reviewtiming.n + EXCLUDED.n""",
                [(*k, n) for k, n in sorted(times.items())],
            )
            if any(k[0] < today for k in counts):
                bump_version(cur)
        _fold_streaks(rows, set(ids))
        return len(rows)


def bump_version(cur: Any) -> None:
    """A past day's tallies changed: the stats page's cached sums of past days are
    stale (ReviewTallyVersion). In the writer's transaction, after its tallies' rows.
    The new version is the present in microseconds (or one more than the last, if
    that is higher), so a version rolled back is never handed out again."""
    cur.execute(
        """INSERT INTO agents_reviewtallyversion (id, version) VALUES (1, %s)
           ON CONFLICT (id) DO UPDATE SET version = CASE
             WHEN EXCLUDED.version > agents_reviewtallyversion.version THEN EXCLUDED.version
             ELSE agents_reviewtallyversion.version + 1 END""",
        [time.time_ns() // 1000],
    )


def version() -> int:
    """ReviewTallyVersion's version (0 before any late fold). Written out: the stats
    page reads it on every load, and the queryset cost more to build than to run."""
    with connection.cursor() as cur:
        cur.execute("SELECT version FROM agents_reviewtallyversion WHERE id = 1")
        row = cur.fetchone()
    return int(row[0]) if row else 0


# -- approval fatigue's streaks ---------------------------------------------------------

StreakKey = tuple[int, str, str, int]  # (profile id, tool, rule origin or '', rule index or 0)


def streak_call(
    pk: int, profile_id: int, origin: str | None, index: Any, decided: dt.datetime, kind: str, tool: str,
    round_: int, risk: str, required: int, status: str,
) -> tuple[StreakKey, streaks.Call] | None:
    """A closed call's streak key and what it brings to the streak; None for calls no
    streak counts (an outcome-unknown call's; a launch rule's, which no profile rule
    could answer, since launch rules come first)."""
    if kind != decisions.POLICY or origin == "launch":
        return None
    key = (profile_id, tool, origin or "", int(index) if origin and index is not None else 0)
    unchanged = status == decisions.APPROVED and round_ == 0
    return key, streaks.Call((decided, pk), unchanged, risk == "irreversible", required)


def streak_calls(key: StreakKey, after: streaks.Point | None, base: QuerySet[Approval] | None = None) -> QuerySet[Approval]:
    """The approved unchanged calls of `key` decided after `after` (None: all of them),
    among `base` (default: every approval)."""
    profile_id, tool, origin, index = key
    qs = (Approval.objects.all() if base is None else base).filter(
        kind=decisions.POLICY, status=decisions.APPROVED, round=0, tool=tool, run__profile_id=profile_id
    )
    # JSON lookups, not KT's text: on SQLite a text compared with KT is read as JSON.
    qs = qs.filter(rule__origin=origin, rule__index=index) if origin else qs.filter(
        Q(rule__isnull=True) | Q(rule__origin__isnull=True)
    )
    if after is not None:
        qs = qs.filter(Q(decided_at__gt=after[0]) | Q(decided_at=after[0], pk__gt=after[1]))
    return qs


def recount(key: StreakKey, after: streaks.Point, *, besides: Collection[int] = ()) -> streaks.Streak:
    """The streak of `key`'s folded calls after `after` (`besides`: ids being folded
    now, counted by the fold itself). Only for a breaker folded late, which is rare."""
    r = streak_calls(key, after).filter(tallied=True).exclude(pk__in=besides).aggregate(
        n=Count("pk"), votes=Max("required"), irreversible=Count("pk", filter=Q(risk="irreversible"))
    )
    return streaks.Streak(length=r["n"], irreversible=bool(r["irreversible"]), votes=r["votes"] or 1)


def streak_of(row: ReviewStreak) -> streaks.Streak:
    return streaks.Streak(
        length=row.length, irreversible=row.irreversible, votes=row.votes,
        broken=(row.broken_at, row.broken_id) if row.broken_at is not None else None,
        last=(row.last_at, row.last_id) if row.last_at is not None else None,
    )


def _fold_streaks(rows: list[tuple[Any, ...]], ids: set[int]) -> None:
    """The batch's calls into their keys' streaks, in the fold's transaction: each key's
    row created if new, then locked in key order (two folders never wait on each
    other's rows crosswise; a streak, unlike a count, must be read to be added to)."""
    by_key: dict[StreakKey, list[streaks.Call]] = {}
    for pk, profile_id, origin, index, _esc, _by, status, _created, decided, kind, tool, round_, risk, required in rows:
        found = streak_call(pk, profile_id, origin, index, decided, kind, tool, round_, risk, required, status)
        if found is not None:
            by_key.setdefault(found[0], []).append(found[1])
    if not by_key:
        return
    keys = sorted(by_key)
    with connection.cursor() as cur:
        cur.executemany(
            """INSERT INTO agents_reviewstreak (profile_id, tool, origin, "index", length, irreversible, votes,
                   broken_id, last_id)
               VALUES (%s, %s, %s, %s, 0, false, 1, 0, 0)
               ON CONFLICT (profile_id, tool, origin, "index") DO NOTHING""",
            keys,
        )
    q = Q()
    for profile_id, tool, origin, index in keys:
        q |= Q(profile_id=profile_id, tool=tool, origin=origin, index=index)
    locked = ReviewStreak.objects.select_for_update().filter(q).order_by("profile_id", "tool", "origin", "index")
    changed = []
    for row in locked:
        key = (row.profile_id, row.tool, row.origin, row.index)
        s = streaks.fold(streak_of(row), by_key[key], lambda after, key=key: recount(key, after, besides=ids))  # type: ignore[misc]
        row.length, row.irreversible, row.votes = s.length, s.irreversible, s.votes
        row.broken_at, row.broken_id = s.broken if s.broken is not None else (None, 0)
        row.last_at, row.last_id = s.last if s.last is not None else (None, 0)
        changed.append(row)
    ReviewStreak.objects.bulk_update(
        changed, ["length", "irreversible", "votes", "broken_at", "broken_id", "last_at", "last_id"]
    )
