"""Approval fatigue's streaks as plain data, folded a closed call at a time.

The calls of one key (agent profile, tool, rule that asked) are ordered by their
decision, `(decided_at, id)`: the key's streak is its calls approved unchanged after the
newest call that was not (a reject, an expiry, an approval of edited arguments). Folded
in that order each call is one comparison. A call can also come late (its decision was
committed after a newer one had been folded): it is placed by its point all the same.
An approval after the break adds one, anything up to the break changes nothing, and a
breaker older than the newest call folded ends the streak where it stands: the calls
after it are counted again by `recount`, which the caller answers from its rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Point = tuple[dt.datetime, int]  # (decided_at, id): the order of a key's calls


@dataclass
class Streak:
    length: int = 0  # calls approved unchanged after `broken`
    irreversible: bool = False  # one of them was an irreversible tool's
    votes: int = 1  # the most votes one of them needed
    broken: Point | None = None  # the newest call that broke it; None: none did
    last: Point | None = None  # the newest call folded


@dataclass(frozen=True)
class Call:
    point: Point
    unchanged: bool  # approved as proposed: no edit, no reject, no expiry
    irreversible: bool = False
    votes: int = 1


Recount = Callable[[Point], Streak]  # the calls after a point already folded, as a streak


def fold(streak: Streak, calls: Iterable[Call], recount: Recount) -> Streak:
    """`streak` with `calls` (one key's, in any order) folded in."""
    s = dataclasses.replace(streak)
    for c in sorted(calls, key=lambda c: c.point):
        if s.broken is not None and c.point <= s.broken:
            pass  # before the break: the streak after it is the same
        elif c.unchanged:
            s.length += 1
            s.irreversible |= c.irreversible
            s.votes = max(s.votes, c.votes)
        elif s.last is None or c.point > s.last:
            s = Streak(broken=c.point, last=s.last)
        else:
            # A late breaker between the break and the newest call: only the calls
            # folded after it still count. The later calls of `calls` come next.
            s = dataclasses.replace(recount(c.point), broken=c.point, last=s.last)
        s.last = c.point if s.last is None else max(s.last, c.point)
    return s


def walk(calls: Iterable[Call]) -> Streak:
    """The streak of a key's calls all at hand (the exact figure, and a check on fold)."""
    return fold(Streak(), calls, lambda point: Streak())
