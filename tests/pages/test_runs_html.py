"""The runs list's rows (agents/web/runs_html.py, a Jinja2 template) are the HTML the Django
template loop printed, escaping included; the old loop is kept here as the reference."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.template import Context
from django.utils import timezone

from agents.models import Run
from agents.web import runs_html
from bench.builders import DJANGO_ROWS
from tests.helpers import call, client_for, final

pytestmark = pytest.mark.django_db



def squeeze(html: str) -> str:
    return re.sub(r"\s+", " ", html).replace("> <", "><").strip()


def test_rows_are_the_templates_rows(launch, drive) -> None:
    hostile = '<script>alert("x")</script> & "quotes" ' + "e\u0301" * 60  # escaped, cut, NFC-normalised
    runs = [
        drive(launch([call("echo", text="a"), final()], task=hostile)),
        drive(launch([final("bye")], task="plain")),
        launch([final()], task="still queued"),
    ]
    finished = dt.datetime(2026, 3, 29, 0, 59, 59, 123456, tzinfo=dt.UTC)
    Run.objects.filter(pk=runs[0].pk).update(tainted=True, cost_unknown=True, cost_micros=1_234_567, tokens=12_345)
    Run.objects.filter(pk=runs[1].pk).update(
        created_at=finished - dt.timedelta(hours=2, seconds=5), finished_at=finished
    )
    # The still-queued run's duration runs on with the clock: compared without it below.
    shown = list(Run.objects.filter(pk__in=[r.pk for r in runs]).select_related("profile").order_by("pk"))

    with timezone.override("Europe/Berlin"):  # the date filter shows local time
        expected = squeeze(DJANGO_ROWS.render(Context({"rows": shown})))
        built = squeeze(runs_html.rows(shown))

    def without_running_duration(html: str) -> str:
        return re.sub(r'<td class="num">[^<]*</td></tr>$', "", html)

    assert without_running_duration(built) == without_running_duration(expected)
    assert built.count("<tr>") == 3
    assert "&lt;script&gt;" in built and "<script>" not in built
    assert ">2026-03-28 23:59<" in built and "2 h 00 min" in built  # Berlin's 23:59 is 22:59 UTC


def test_the_runs_page_lists_the_rows_and_says_when_there_are_none(otto, launch) -> None:
    c = client_for(otto)
    assert "No runs yet." in c.get("/runs/").content.decode()
    run = launch([final()], task="list me <b>")
    page = c.get("/runs/").content.decode()
    assert f'href="/runs/{run.pk}/"' in page and "list me &lt;b&gt;" in page and "No runs yet." not in page
