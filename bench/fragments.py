"""The runs list's rows, µs per row: the Django template loop they once were, the string
builder they were until the Jinja2 template (agents/web/runs_html.py before it), and the
Jinja2 template through Django's jinja2 backend (agents/jinja2/agents/runs_rows.html).

    python bench/fragments.py [ROWS] [REPEATS]

In memory, no database: a page's worth of runs (50, with their profiles) built as the list
reads them, each way rendered REPEATS times per round; the best of 15 rounds is printed,
as one line per way and a JSON line. Not part of `make bench` or of the tests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import sys
import timeit
from html import escape
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.template import Context, Template  # noqa: E402
from django.utils import timezone  # noqa: E402
from django.utils.safestring import mark_safe  # noqa: E402
from django.utils.text import Truncator  # noqa: E402

from agents.models import AgentProfile, Run  # noqa: E402
from agents.web import runs_html  # noqa: E402
from agents.web.formatting import number, since, usd  # noqa: E402
from agents.web.markup import url_for  # noqa: E402

DJANGO_LOOP = Template(
    """{% load airlock %}{% for run in rows %}
    <tr>
      <td><a href="{% url 'run_detail' run.pk %}">#{{ run.pk }}</a><div class="task-line">{{ run.task|truncatechars:90 }}</div></td>
      <td>{{ run.profile.name }}</td>
      <td><span class="state state-{{ run.state }}">{{ run.state }}</span></td>
      <td class="num">{{ run.steps }}</td>
      <td class="num">{{ run.cost_micros|usd }}{% if run.cost_unknown %} <span class="hint" title="a model call reported no usage">+?</span>{% endif %}</td>
      <td class="num">{{ run.tokens|number }}</td>
      <td>{% if run.tainted %}<span class="taint-badge">tainted</span>{% endif %}</td>
      <td><time datetime="{{ run.created_at|date:'c' }}">{{ run.created_at|date:"Y-m-d H:i" }}</time></td>
      <td class="num">{{ run.created_at|since:run.finished_at }}</td>
    </tr>{% endfor %}"""  # noqa: E501
)


def builder_row(run: Any, tz: Any) -> str:
    """agents/web/runs_html.py:row as it was (also the oracle of tests/runs/test_runs_rows_oracle.py)."""
    created = run.created_at.astimezone(tz)
    unknown = ' <span class="hint" title="a model call reported no usage">+?</span>' if run.cost_unknown else ""
    taint = '<span class="taint-badge">tainted</span>' if run.tainted else ""
    return (
        "    <tr>\n"
        f'      <td><a href="{url_for("run_detail", run.pk)}">#{run.pk}</a>'
        f'<div class="task-line">{escape(str(Truncator(run.task).chars(90)))}</div></td>\n'
        f"      <td>{escape(str(run.profile.name))}</td>\n"
        f'      <td><span class="state state-{escape(run.state)}">{escape(run.state)}</span></td>\n'
        f'      <td class="num">{run.steps}</td>\n'
        f'      <td class="num">{usd(run.cost_micros)}{unknown}</td>\n'
        f'      <td class="num">{number(run.tokens)}</td>\n'
        f"      <td>{taint}</td>\n"
        f'      <td><time datetime="{created.isoformat()}">{created:%Y-%m-%d %H:%M}</time></td>\n'
        f'      <td class="num">{since(run.created_at, run.finished_at)}</td>\n'
        "    </tr>\n"
    )


def builder_rows(runs: list[Any]) -> str:
    tz = timezone.get_current_timezone()
    return mark_safe("".join(builder_row(run, tz) for run in runs))


def page_of_runs(n: int) -> list[Run]:
    profile = AgentProfile(pk=1, name="demo", provider="demo")
    start = dt.datetime(2026, 3, 29, 0, 59, tzinfo=dt.UTC)
    runs = []
    for i in range(n):
        created = start + dt.timedelta(minutes=i)
        run = Run(
            pk=100_000 + i,
            profile=profile,
            task=f'Refund order {1000 + i} <b>"now"</b> & then ' * (1 + i % 4),
            state=["done", "failed", "awaiting_approval", "planning"][i % 4],
            steps=i,
            cost_micros=1234 * i,
            cost_unknown=i % 5 == 0,
            tokens=987 * i,
            tainted=i % 3 == 0,
            created_at=created,
            finished_at=created + dt.timedelta(seconds=42.5) if i % 4 < 2 else None,
        )
        runs.append(run)
    return runs


ROUNDS = 15


def main(rows: int = 50, repeats: int = 50) -> dict[str, float]:
    runs = page_of_runs(rows)
    ways = {
        "django_template": lambda: DJANGO_LOOP.render(Context({"rows": runs})),
        "string_builder": lambda: builder_rows(runs),
        "jinja2": lambda: runs_html.rows(runs),
    }
    best = dict.fromkeys(ways, float("inf"))
    with timezone.override("Europe/Berlin"):
        assert ways["jinja2"]() == ways["string_builder"](), "the template and the builder disagree"
        for way in ways.values():
            way()  # compiled, cached
        # Rounds taken in turn, so a neighbour's load on a shared machine hits all three.
        for _ in range(ROUNDS):
            for name, way in ways.items():
                best[name] = min(best[name], timeit.timeit(way, number=repeats))
    result = {name: round(seconds / repeats / rows * 1e6, 1) for name, seconds in best.items()}
    for name, us in result.items():
        print(f"{name:16} {us:7.1f} µs per row ({us / result['string_builder']:.2f}x the builder)")
    print(json.dumps({"rows": rows, "us_per_row": result}))
    return result


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
