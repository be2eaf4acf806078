"""agents.lib.rows: plain SQL reads give what the ORM's values_list(named=True) gives."""

from __future__ import annotations

import pytest

from agents.lib.rows import Rows, placeholders
from agents.models import Message, ToolCall, Transition
from agents.web import timeline
from tests.helpers import call, final

pytestmark = pytest.mark.django_db


def test_rows_hold_the_orm_values_json_and_times_included(launch, drive) -> None:
    run = drive(launch([call("echo", text="hi <b>", usage={"input_tokens": 7, "output_tokens": 3}), final("ok")]))
    fields = timeline.TRANSITION_FIELDS
    expected = list(Transition.objects.filter(run=run, seq__gt=1).order_by("seq").values_list(*fields, named=True))
    got = Rows(Transition, fields).fetch("run_id = %s AND seq > %s", [run.pk, 1], order_by="seq")
    assert [tuple(r) for r in got] == [tuple(r) for r in expected] and len(got) > 2
    assert got[0].seq == 2 and isinstance(got[0].payload, dict)
    assert type(got[0].created_at) is type(expected[0].created_at)
    messages = Rows(Message, timeline.MESSAGE_FIELDS).fetch("run_id = %s", [run.pk], order_by='"index"')
    assert [tuple(m) for m in messages] == [
        tuple(m) for m in Message.objects.filter(run=run).order_by("index").values_list(*timeline.MESSAGE_FIELDS)
    ]
    assert any(m.tool_calls for m in messages)  # a JSON list, decoded


def test_rows_limit_and_an_in_list(launch, drive) -> None:
    run = drive(launch([call("echo", text="a"), call("echo", text="b"), final("ok")]))
    ids = list(ToolCall.objects.filter(run=run).order_by("id").values_list("call_id", flat=True))
    journal = Rows(ToolCall, timeline.JOURNAL_FIELDS)
    rows = journal.fetch(f"run_id = %s AND call_id IN ({placeholders(ids)})", [run.pk, *ids], order_by="id", limit=1)
    assert len(ids) == 2 and [r.call_id for r in rows] == ids[:1]
    assert rows[0].status == "succeeded" and rows[0].result_truncated is False


def test_the_chart_series_and_cache_sums_match_the_orm(launch, drive) -> None:
    usage = {"input_tokens": 500, "output_tokens": 10, "cached_input_tokens": 400, "cache_write_tokens": 80}
    run = drive(launch([call("echo", text="a", usage=usage), final("ok", usage={**usage, "cache_write_tokens": 0})]))
    points, cache = timeline.series_and_cache(run)
    assert points == list(run.transitions.order_by("seq").values_list("seq", "cost_micros", "tokens"))
    assert cache == run.cache_tokens() == {"read": 800, "write": 80}
    assert timeline.series(run) == points
