"""agents.lib.rows: plain SQL reads give what the ORM's values_list(named=True) gives."""

from __future__ import annotations

import pytest
from django.db import models
from django.db.models.signals import post_init, pre_init

from agents.lib.rows import Columns, Rows, fetch, placeholders
from agents.models import Message, Run, ToolCall, Transition
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


def _fields(obj: object) -> dict[str, object]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}  # type: ignore[attr-defined]


def test_an_instance_is_made_without_init_unless_an_init_receiver_listens(launch, drive, monkeypatch) -> None:
    """Columns.instance skips Model.__init__'s walk over the fields (the ORM's own
    instance has the same values and state), and goes through from_db, receivers
    called, once a pre_init or post_init receiver listens for the model."""
    run = drive(launch([call("echo", text="hi"), final("ok")]))
    columns = Columns(Run, "a")
    [row] = fetch(f"SELECT {columns.sql} FROM agents_run a WHERE a.id = %s", [run.pk])
    orm = Run.objects.get(pk=run.pk)
    inits: list[object] = []
    original = models.Model.__init__

    def counted(self: models.Model, *args: object, **kwargs: object) -> None:
        inits.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(models.Model, "__init__", counted)
    made = columns.instance(row)
    assert inits == [] and _fields(made) == _fields(orm)
    assert (made._state.adding, made._state.db) == (False, "default") and made.get_deferred_fields() == set()
    heard: list[object] = []

    def receiver(sender: type, **kwargs: object) -> None:
        heard.append(kwargs.get("instance"))  # post_init's; pre_init sends none

    for signal in (pre_init, post_init):
        signal.connect(receiver, sender=Run)
        try:
            again = columns.instance(row)
        finally:
            signal.disconnect(receiver, sender=Run)
        assert _fields(again) == _fields(made) and again._state.adding is False
    assert len(inits) == 2 and heard == [None, inits[-1]]
