"""Approval fatigue's streaks folded a batch at a time (agents/engine/streaks.py): in
whatever order the batches come, the folded streak is the one walked over every call."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from agents.engine import streaks
from agents.engine.streaks import Call, Streak

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def calls(pattern: str) -> list[Call]:
    """'a' approved unchanged, 'x' a break (a reject, an edit, an expiry), 'i' an
    irreversible tool's approval, '2' one that needed two votes; a minute apart."""
    return [
        Call((T0 + dt.timedelta(minutes=n), n + 1), unchanged=c != "x", irreversible=c == "i", votes=2 if c == "2" else 1)
        for n, c in enumerate(pattern)
    ]


def test_a_walk_counts_the_approvals_after_the_newest_break() -> None:
    s = streaks.walk(calls("aaxaaiaa"))
    assert (s.length, s.irreversible, s.votes) == (5, True, 1)
    assert s.broken == calls("aaxaaiaa")[2].point and s.last == calls("aaxaaiaa")[-1].point
    assert streaks.walk(calls("aaa2")).votes == 2
    assert streaks.walk(calls("aaax")).length == 0 and streaks.walk([]) == Streak()


def test_an_approval_before_the_break_folded_late_changes_nothing() -> None:
    every = calls("aaxaa")
    folded = streaks.fold(streaks.walk(every[1:]), [every[0]], lambda after: pytest.fail("no recount"))
    assert folded == streaks.walk(every)


def test_a_breaker_folded_late_keeps_only_the_calls_after_it() -> None:
    every = calls("aaaaxaaa")
    early, breaker = every[:4] + every[5:], every[4]
    folded_first = streaks.walk(early)
    assert folded_first.length == 7

    def recount(after: streaks.Point) -> Streak:
        return streaks.walk([c for c in early if c.point > after])

    assert streaks.fold(folded_first, [breaker], recount) == streaks.walk(every)


@pytest.mark.parametrize("seed", range(40))
def test_batches_in_any_order_fold_to_the_walk_of_every_call(seed: int) -> None:
    rng = random.Random(seed)
    every = calls("".join(rng.choice("aaaaaaxi2") for _ in range(rng.randint(0, 60))))
    shuffled = every[:]
    rng.shuffle(shuffled)
    s, done = Streak(), []
    while shuffled:
        size = rng.randint(1, 9)
        batch, shuffled = shuffled[:size], shuffled[size:]

        def recount(after: streaks.Point, done: list[Call] = done) -> Streak:
            # What the rows answer: the calls folded before this batch, after `after`.
            return streaks.walk([c for c in done if c.point > after])

        s = streaks.fold(s, batch, recount)
        done.extend(batch)
    assert s == streaks.walk(every)
