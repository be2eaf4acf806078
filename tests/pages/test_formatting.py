"""agents/web/formatting.py: money and durations read the same on every page."""

from __future__ import annotations

import datetime as dt

import pytest

from agents.web import formatting


@pytest.mark.parametrize(
    "micros, shown",
    [(None, "—"), (0, "$0"), (1, "$0.000001"), (4_500, "$0.0045"), (1_000_000, "$1.00"), (2_345_678_901, "$2,345.68")],
)
def test_money_in_micro_dollars_keeps_the_digits_a_cheap_step_needs(micros, shown) -> None:
    assert formatting.usd(micros) == shown


@pytest.mark.parametrize("value, shown", [(None, "—"), (420, "420 ms"), (3_200, "3.2 s"), (125_000, "2 min 05 s")])
def test_step_durations(value, shown) -> None:
    assert formatting.ms(value) == shown


@pytest.mark.parametrize(
    "seconds, shown", [(-3, "0 s"), (59, "59 s"), (240, "4 min"), (7_500, "2 h 5 min"), (7_200, "2 h"), (100_800, "1 d 4 h")]
)
def test_waiting_times_on_review_cards(seconds, shown) -> None:
    assert formatting.short_duration(seconds) == shown


def test_a_run_span_runs_to_now_while_the_run_goes_on() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert formatting.since(start, start + dt.timedelta(hours=1, minutes=2)) == "1 h 02 min"
    assert formatting.since(None, None) == "—"
    assert formatting.since(dt.datetime.now(tz=dt.UTC), None).endswith(" s")
