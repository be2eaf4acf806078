"""The runs list's rows as HTML, built in Python.

The list shows 50 runs; through the template engine a row cost about 110 µs (every
variable and filter of it a node to resolve), two thirds of the page's time. Here a
row is a few string joins. The task and the agent's name go through `esc`
(agents/web/markup.py), as the template's autoescape did; times are shown in the current
time zone, as the `date` filter shows them. The page around the rows stays in
agents/runs.html, which calls `rows`.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from agents.web.formatting import number, since, usd
from agents.web.markup import esc, url_for

TASK_CHARS = 90  # the task's first line under the run's number


def row(run: Any, tz: Any) -> str:
    created = run.created_at.astimezone(tz)
    unknown = ' <span class="hint" title="a model call reported no usage">+?</span>' if run.cost_unknown else ""
    taint = '<span class="taint-badge">tainted</span>' if run.tainted else ""
    return (
        "    <tr>\n"
        f'      <td><a href="{url_for("run_detail", run.pk)}">#{run.pk}</a>'
        f'<div class="task-line">{esc(Truncator(run.task).chars(TASK_CHARS))}</div></td>\n'
        f"      <td>{esc(run.profile.name)}</td>\n"
        f'      <td><span class="state state-{esc(run.state)}">{esc(run.state)}</span></td>\n'
        f'      <td class="num">{run.steps}</td>\n'
        f'      <td class="num">{usd(run.cost_micros)}{unknown}</td>\n'
        f'      <td class="num">{number(run.tokens)}</td>\n'
        f"      <td>{taint}</td>\n"
        f'      <td><time datetime="{created.isoformat()}">{created:%Y-%m-%d %H:%M}</time></td>\n'
        f'      <td class="num">{since(run.created_at, run.finished_at)}</td>\n'
        "    </tr>\n"
    )


def rows(runs: list[Any]) -> SafeString:
    """The table rows of `runs` (each with its profile)."""
    tz = timezone.get_current_timezone()
    return mark_safe("".join(row(run, tz) for run in runs))
