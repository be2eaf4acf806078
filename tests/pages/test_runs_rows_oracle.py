"""The runs list's rows moved from a string builder to a Jinja2 template
(agents/jinja2/agents/runs_rows.html) without changing a byte: the old builder is kept
here as the oracle, and both print the same rows for hostile text, every state, runs with
and without a launcher, in UTC and in Berlin."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.template import engines
from django.template.loader import get_template
from django.utils import timezone
from jinja2.exceptions import UndefinedError

from agents.engine import states
from agents.models import AgentProfile, Run
from agents.web import runs_html
from bench.builders import esc, old_rows
from tests.helpers import client_for, final

pytestmark = pytest.mark.django_db


# -- the rows ----------------------------------------------------------------------------

HOSTILE = [
    '<script>alert("x")</script>',
    "quotes \" and ' and `back` & &amp; &lt;b&gt; </td></tr><tr>",
    "unicode: e\u0301 \u00e9 \u202eevil\u202c \U0001f512 \u00a0nbsp \u2028line sep\u3000ideographic",
    "multi\nline\r\ntask\twith tabs",
    "long " + "x<y&" * 200,  # cut at 90 characters, after the escape would have grown it
    "  padded, " + "\u00e9" * 89 + "  ",  # 90 and more characters, some of them combined
]
# Around the switch to summer time in Berlin, across midnight and the new year in Berlin,
# with and without microseconds.
CREATED = [
    dt.datetime(2026, 3, 29, 0, 59, 59, 999999, tzinfo=dt.UTC),
    dt.datetime(2026, 3, 29, 1, 0, 0, tzinfo=dt.UTC),
    dt.datetime(2026, 10, 25, 0, 30, 0, 5, tzinfo=dt.UTC),
    dt.datetime(2025, 12, 31, 23, 30, 0, tzinfo=dt.UTC),
    dt.datetime(2026, 7, 1, 22, 15, 30, 250000, tzinfo=dt.UTC),
]
# A run still going shows its age, which runs on with the clock: those are created in the
# future, so their age is a steady "0.0 s".
FUTURE = dt.datetime(2999, 1, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def shown(launch, lena) -> list[Run]:
    """A run per state and hostile task, every other one launched by a person, the list's
    way of reading them (select_related profile, engine and script deferred)."""
    hostile_profile = AgentProfile.objects.get(name="scripted")
    hostile_profile.pk = None
    hostile_profile.name = '<b>"o\'k"</b>&amp;'  # not a slug: the database takes it anyway
    hostile_profile.save()
    ids = []
    for i, state in enumerate(states.STATES):
        for j, task in enumerate(HOSTILE):
            n = i * len(HOSTILE) + j
            run = launch([final()], task=task, user=lena if n % 2 else None)
            finished = n % 3 != 0
            created = CREATED[n % len(CREATED)] if finished else FUTURE
            Run.objects.filter(pk=run.pk).update(
                state=state,
                profile=hostile_profile if n % 4 == 1 else run.profile,
                steps=n * 7,
                cost_micros=[0, 1, 999_999, 1_234_567, 10**12][n % 5],
                cost_unknown=n % 2 == 0,
                tokens=[0, 999, 1000, 12_345_678][n % 4],
                tainted=n % 3 == 1,
                created_at=created,
                finished_at=created + dt.timedelta(seconds=n * 61.5) if finished else None,
            )
            ids.append(run.pk)
    runs = list(Run.objects.filter(pk__in=ids).select_related("profile").defer("engine", "script").order_by("pk"))
    assert {r.state for r in runs} == set(states.STATES) and len(states.STATES) == 7, "every state"
    assert {r.created_by_id is None for r in runs} == {True, False}, "with and without a launcher"
    return runs


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_the_template_prints_the_old_builders_rows_byte_for_byte(shown, zone) -> None:
    with timezone.override(zone):
        expected = old_rows(shown)
        rendered = runs_html.rows(shown)

    assert rendered == expected
    assert rendered.count("    <tr>\n") == len(shown)
    assert "<script>" not in rendered and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in rendered
    assert "&lt;b&gt;&quot;o&#x27;k&quot;&lt;/b&gt;&amp;amp;" in rendered  # the profile's name
    berlin = zone == "Europe/Berlin"
    # 00:59:59.999999 UTC on 29 March is 01:59 in Berlin, one microsecond before 03:00 CEST.
    assert ('datetime="2026-03-29T01:59:59.999999+01:00">2026-03-29 01:59<' in rendered) is berlin
    assert ('datetime="2026-03-29T03:00:00+02:00">2026-03-29 03:00<' in rendered) is berlin
    assert ('datetime="2025-12-31T23:30:00+00:00">2025-12-31 23:30<' in rendered) is not berlin


def test_the_runs_page_shows_the_old_builders_rows(shown, root) -> None:
    page = client_for(root).get("/runs/").content.decode()

    tbody = re.search(r"<tbody>\n  \n  (.*?)\n  </tbody>", page, re.S)
    assert tbody, page
    newest_first = sorted(shown, key=lambda r: (r.created_at, r.pk), reverse=True)
    assert tbody.group(1) == old_rows(newest_first)


def test_pages_come_from_the_django_engine_and_fragments_from_jinja2(shown) -> None:
    assert get_template("agents/runs.html").backend.name == "django"
    assert get_template("agents/runs_rows.html").backend.name == "jinja2"  # no Django template by that name
    jinja = engines["jinja2"]
    # Escaped unless a template says otherwise, and a misspelt name raises.
    hostile = "<i>&</i>"
    assert jinja.from_string("{{ v }}|{{ v|safe }}").render({"v": hostile}) == f"{esc(hostile)}|{hostile}"
    plural = jinja.from_string("{{ n }} entr{{ n|pluralize('y,ies') }}, {{ n }} run{{ n|pluralize }}")
    assert [plural.render({"n": n}) for n in (0, 1, 2)] == ["0 entries, 0 runs", "1 entry, 1 run", "2 entries, 2 runs"]
    with pytest.raises(UndefinedError, match="runz"):
        jinja.from_string("{{ runz }}").render({})
