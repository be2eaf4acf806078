"""Time to decision: `decided_at - created_at` of the calls a person answered, its
percentiles in the database (PostgreSQL's `percentile_cont`) or from the durations read
back (SQLite), and from the tallies' log-spaced buckets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Aggregate, Count, F, FloatField, Func, IntegerField, QuerySet

from agents.ops import review_tally


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
    decided = qs.filter(status__in=review_tally.PEOPLE)
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


def hist_timing(hist: dict[int, int]) -> Timing:
    n = sum(hist.values())
    if not n:
        return Timing()
    p50, p95 = review_tally.percentiles(hist, (0.5, 0.95))
    return Timing(n, p50, p95)
