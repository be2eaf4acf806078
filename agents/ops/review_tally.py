"""The review statistics' daily tallies: closed calls folded into counts per UTC day,
agent, rule, escalated or not, reviewer and status, and time to decision as counts per
log-spaced bucket (`/reviews/stats/` reads them for the whole days of its window).

Each closed approval is folded once, whenever its decision is committed: the fold takes
the approvals not yet `tallied` (locked, skipping those another folder holds), marks
them and adds their counts in the same transaction. The sweeper folds on each pass.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from typing import Any

from django.db import connection, transaction
from django.db.models.fields.json import KT

from agents.engine import decisions
from agents.models import Approval

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
    n = sum(hist.values())
    if not n:
        return None
    pos = fraction * (n - 1)
    low, high = math.floor(pos), math.ceil(pos)
    values: dict[int, float] = {}
    seen = 0
    for bucket in sorted(hist):
        count = hist[bucket]
        for rank in (low, high):
            if rank not in values and rank < seen + count:
                values[rank] = bucket_seconds(bucket)
        seen += count
        if high in values:
            break
    return values[low] + (values[high] - values[low]) * (pos - low)


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
    with transaction.atomic():
        rows = list(
            Approval.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(tallied=False, decided_at__isnull=False, status__in=CLOSED)
            .order_by("decided_at", "pk")
            .values_list(
                "pk", "run__profile_id", KT("rule__origin"), KT("rule__index"), "escalated_at", "decided_by_id",
                "status", "created_at", "decided_at",
            )[:batch]
        )
        if not rows:
            return 0
        ids = [r[0] for r in rows]
        if Approval.objects.filter(pk__in=ids, tallied=False).update(tallied=True) != len(ids):
            raise _Lost
        counts: Counter[tuple[Any, ...]] = Counter()
        times: Counter[tuple[Any, ...]] = Counter()
        for _, profile_id, origin, index, escalated_at, by, status, created, decided in rows:
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
        return len(rows)
