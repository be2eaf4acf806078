"""/reviews/stats/: every figure against rows whose answers are known, the window, and
who may read it. The percentiles are PostgreSQL's; the SQLite fallback is held to them
on the same rows, and the page is rendered once on SQLite itself (a subprocess)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from agents.models import AgentProfile, Approval
from reviews import stats
from reviews.stats.figures import ReviewerRow, RuleRow
from reviews.stats.timing import Timing, percentile_cont, timings
from reviews.stats.windows import AGENT
from tests.helpers import client_for, on_fresh_sqlite, person, requires_postgres
from tests.reviews import rows

pytestmark = pytest.mark.django_db



@pytest.fixture
def history(defaults: None, rita: Any, rob: Any) -> dict[str, Any]:
    """Known rows: people's waits 10, 20, 30, 40 s (scripted) and 200 s (demo) in the
    last week, one expiry, one decision 8 days ago, two pending calls."""
    s, d = rows.a_run("scripted"), rows.a_run("demo")
    r1 = rows.profile_rule(1)
    out = {
        "a1": rows.approval(s, by=rita, wait=10, rule=r1),
        "a2": rows.approval(s, by=rita, wait=20, rule=r1),
        "a3": rows.approval(s, by=rob, wait=30, rule=r1, status="rejected", escalated_ago=3000),
        "a4": rows.approval(s, wait=100, rule=r1, status="expired"),
        "a5": rows.approval(s, by=rob, wait=40),
        "a6": rows.approval(d, by=rita, wait=200),
        "old": rows.approval(s, by=rita, wait=1000, closed_ago=8 * 86400, escalated_ago=8 * 86400),
    }
    # Pending ones need runs of their own (one open question per run).
    out["p1"] = rows.approval(rows.a_run("scripted"), status="pending", wait=500, escalated_ago=100)
    out["p2"] = rows.approval(rows.a_run("demo"), status="pending", wait=50)
    rows.claim(out["p1"], rita, until_ago=60)  # never let go, past its time: lapsed
    rows.claim(out["a1"], rob, until_ago=7300, end="lapsed", ended_ago=7200)
    rows.claim(out["a2"], rita, until_ago=3000, end="decided", ended_ago=3700)
    rows.claim(out["p2"], rob, until_ago=-600)  # still running
    rows.claim(out["old"], rob, until_ago=9 * 86400, end="lapsed", ended_ago=9 * 86400)
    return out


def test_pending_now_and_the_oldest(history: dict[str, Any], rita: Any) -> None:
    figures = stats.stats(rita, days=7)
    assert figures.pending == 2
    assert figures.oldest is not None and figures.oldest.pk == history["p1"].pk
    assert (figures.oldest.tool, figures.oldest.agent) == ("ledger_write", "scripted")
    assert 500 <= figures.oldest_age < 560
    html = client_for(rita).get("/reviews/stats/").content.decode()
    assert f"#{history['p1'].pk} ledger_write</a> (scripted), waiting" in html


def test_a_reviewer_of_one_agent_sees_its_oldest_pending_call(history: dict[str, Any]) -> None:
    """Read through the viewer's own approvals (the written-out statement reads every call)."""
    Group.objects.get_or_create(name="demo-reviewers")
    AgentProfile.objects.filter(name="demo").update(reviewer_group="demo-reviewers")
    figures = stats.stats(person("dora", "demo-reviewers"), days=7)
    assert figures.pending == 1
    assert figures.oldest is not None and (figures.oldest.pk, figures.oldest.agent) == (history["p2"].pk, "demo")


def test_time_to_decision_overall_and_per_agent(history: dict[str, Any], rita: Any) -> None:
    figures = stats.stats(rita, days=7)
    # People's decisions only: 10, 20, 30, 40, 200 (the expiry and the old one are out).
    assert figures.overall.n == 5
    assert figures.overall.p50 == pytest.approx(30.0)
    assert figures.overall.p95 == pytest.approx(40 + 160 * 0.8)
    agents = dict(figures.agents)
    assert agents["scripted"].n == 4
    assert agents["scripted"].p50 == pytest.approx(25.0)
    assert agents["scripted"].p95 == pytest.approx(38.5)
    assert (agents["demo"].n, agents["demo"].p50, agents["demo"].p95) == (1, pytest.approx(200.0), pytest.approx(200.0))


def test_shares_and_times_per_rule(history: dict[str, Any], rita: Any) -> None:
    by_rule = {(r.agent, r.label): r for r in stats.stats(rita, days=7).rules}
    rule1 = by_rule[("scripted", "rule 1 of the profile")]
    assert (rule1.approved, rule1.rejected, rule1.expired) == (2, 1, 1)
    assert (rule1.approved_share, rule1.rejected_share, rule1.expired_share) == (0.5, 0.25, 0.25)
    assert rule1.timing.n == 3 and rule1.timing.p50 == pytest.approx(20.0) and rule1.timing.p95 == pytest.approx(29.0)
    no_rule = by_rule[("scripted", "no rule (the tool's risk, taint or always-ask)")]
    assert (no_rule.approved, no_rule.rejected, no_rule.expired, no_rule.timing.n) == (1, 0, 0, 1)
    assert by_rule[("demo", "no rule (the tool's risk, taint or always-ask)")].approved == 1
    assert len(by_rule) == 3


def test_decisions_per_reviewer_escalations_and_lapsed_claims(history: dict[str, Any], rita: Any) -> None:
    figures = stats.stats(rita, days=7)
    assert [(r.name, r.approved, r.rejected, r.total) for r in figures.reviewers] == [
        ("rita", 3, 0, 3), ("rob", 1, 1, 2)
    ]
    assert figures.escalations == [("scripted", 2)]
    assert figures.lapsed == [("rita", 1), ("rob", 1)]


def test_a_wider_window_takes_in_older_rows(history: dict[str, Any], rita: Any) -> None:
    figures = stats.stats(rita, days=30)
    assert [(r.name, r.approved) for r in figures.reviewers] == [("rita", 4), ("rob", 1)]
    assert figures.overall.n == 6
    assert figures.escalated == 3
    assert figures.lapsed == [("rita", 1), ("rob", 2)]
    one_day = stats.stats(rita, days=1)
    assert one_day.overall.n == 5 and one_day.chart.hourly and len(one_day.chart.buckets) in (24, 25)


@requires_postgres()  # the one scan is PostgreSQL's (GROUPING SETS); SQLite has the fallback alone
@pytest.mark.parametrize("days", [1, 7, 30])
def test_the_one_scan_and_the_fallback_agree(history: dict[str, Any], rita: Any, days: int) -> None:
    """PostgreSQL's GROUPING SETS statement and the per-figure aggregates SQLite uses."""
    grouped = stats.stats(rita, days=days, in_database=True)
    per_figure = stats.stats(rita, days=days, in_database=False)
    for name in ("overall", "agents", "rules", "reviewers"):
        assert _same(getattr(grouped, name), getattr(per_figure, name)), name
    assert [(b.start, _t(b.timing)) for b in grouped.chart.buckets] == [
        (b.start, _t(b.timing)) for b in per_figure.chart.buckets
    ]


def _t(t: Timing) -> tuple[Any, ...]:
    return (t.n, None if t.p50 is None else round(t.p50, 6), None if t.p95 is None else round(t.p95, 6))


def _same(a: Any, b: Any) -> bool:
    def norm(x: Any) -> Any:
        if isinstance(x, Timing):
            return _t(x)
        if isinstance(x, RuleRow):
            return (x.agent, x.origin, x.index, x.approved, x.rejected, x.expired, _t(x.timing))
        if isinstance(x, ReviewerRow):
            return (x.name, x.approved, x.rejected)
        if isinstance(x, (list, tuple)):
            return [norm(i) for i in x]
        return x

    return norm(a) == norm(b)


@requires_postgres()  # percentiles in the database are PostgreSQL's percentile_cont
def test_timings_in_the_database_and_in_python_agree(history: dict[str, Any]) -> None:
    window = Approval.objects.all()
    for keys in ({}, {"agent": AGENT}):
        in_db = timings(window, keys, in_database=True)
        in_python = timings(window, keys, in_database=False)
        assert {k: _t(t) for k, t in in_db.items()} == {k: _t(t) for k, t in in_python.items()}


def test_percentile_cont_interpolates_between_ranks() -> None:
    assert percentile_cont([], 0.5) is None
    assert percentile_cont([7.0], 0.95) == 7.0
    assert percentile_cont([40.0, 10.0, 30.0, 20.0], 0.5) == 25.0
    assert percentile_cont([10.0, 20.0, 30.0, 40.0, 200.0], 0.95) == pytest.approx(168.0)


def test_the_chart_counts_every_decision_once(history: dict[str, Any], rita: Any) -> None:
    chart = stats.stats(rita, days=7).chart
    assert len(chart.buckets) == 8  # the partial first day through today
    assert sum(b.timing.n for b in chart.buckets) == 5
    assert chart.has_data and chart.p50_points and chart.p95_points


def test_the_page_shows_the_figures_with_the_chart_and_its_table(history: dict[str, Any], rita: Any) -> None:
    response = client_for(rita).get("/reviews/stats/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="decision-chart"' in html and "<title id=\"chart-svg-title\">Time to decision per day" in html
    assert 'id="chart-table"' in html
    assert "p50 30.0 s" in html and "p95 2 min 48 s" in html
    assert f'href="/reviews/{history["p1"].pk}/"' in html
    assert "rule 1 of the profile" in html and "50% (2)" in html and "25% (1)" in html
    assert '<tr class="reviewer"><th scope="row">rob</th><td>1</td><td>1</td><td>2</td></tr>' in html
    assert "scripted: 2" in html  # escalations
    assert "<script" not in html.split("<main", 1)[1]  # the chart needs no script


def test_the_charts_table_has_a_row_a_day_with_its_counts_and_times(history: dict[str, Any], rita: Any) -> None:
    html = client_for(rita).get("/reviews/stats/").content.decode()
    table = html.split('id="chart-table"', 1)[1].split("</table>", 1)[0]
    days = re.findall(r'<tr><th scope="row">(\d{4}-\d\d-\d\d)</th><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td></tr>', table)
    assert len(days) == 8 and sum(int(n) for _, n, _, _ in days) == 5  # the partial first day through today
    assert [(p50, p95) for _, n, p50, p95 in days if n == "0"] == [("—", "—")] * 7
    assert html.count('<circle class="p50"') == 1 and "up to 2 min 48 s" in html


def test_an_empty_window_says_so(defaults: None, rita: Any) -> None:
    html = client_for(rita).get("/reviews/stats/?days=1").content.decode()
    assert "Nobody decided a call in the window." in html
    assert 'id="decision-chart"' not in html
    assert "No rule's calls were approved unchanged 20 times in a row." in html


@pytest.mark.parametrize("raw", ["5", "abc", "-7", "7.0", "0"])
def test_a_bad_window_is_answered_clearly(defaults: None, rita: Any, raw: str) -> None:
    response = client_for(rita).get(f"/reviews/stats/?days={raw}")
    assert response.status_code == 400
    assert "days must be one of 1, 7, 30, 90" in response.content.decode()
    # The default window's figures below the notice, its link marked.
    assert '<a href="/reviews/stats/?days=7" aria-current="page">' in response.content.decode()


@pytest.mark.parametrize("days", [1, 7, 30, 90])
def test_each_window_is_offered_and_marked(defaults: None, rita: Any, days: int) -> None:
    html = client_for(rita).get(f"/reviews/stats/?days={days}").content.decode()
    assert f'<a href="/reviews/stats/?days={days}" aria-current="page">' in html


@pytest.mark.parametrize(
    "role, status", [("operator", 200), ("reviewer", 200), ("superuser", 200), ("launcher", 403), ("nobody", 403)]
)
def test_operators_and_reviewers_read_it_others_do_not(defaults: None, role: str, status: int) -> None:
    groups = {"operator": ["operator"], "reviewer": ["reviewer"], "launcher": ["launcher"]}.get(role, [])
    user = person(f"u-{role}", *groups, superuser=role == "superuser")
    assert client_for(user).get("/reviews/stats/").status_code == status
    nav = client_for(user).get("/runs/").content.decode()
    assert ('href="/reviews/stats/"' in nav) is (status == 200)


def test_anonymous_visitors_go_to_the_login(defaults: None) -> None:
    response = Client().get("/reviews/stats/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Client().post("/reviews/stats/").status_code == 302


def test_only_get(defaults: None, rita: Any) -> None:
    assert client_for(rita, csrf=False).post("/reviews/stats/").status_code == 405


SCENARIO = """
import django, json
django.setup()
from django.contrib.auth.models import Group, User
from django.test import Client
from reviews import stats
from tests.reviews import rows
rita = User.objects.create_user("rita")
rita.groups.add(Group.objects.get(name="reviewer"))
run = rows.a_run("scripted")
for wait in (10, 20, 30, 40, 200):
    rows.approval(run, by=rita, wait=wait, rule=rows.profile_rule(1))
rows.streak(run, 20, by=rita, rule=rows.profile_rule(2), start_ago=20000)
figures = stats.stats(rita, days=7)
# Folded into the daily tallies (the sweeper's upsert on SQLite), with one more call
# three days ago: the page then reads those days from the tallies.
from agents.ops import review_tally
rows.approval(run, by=rita, wait=90, closed_ago=3 * 86400)
folded = review_tally.approvals_tally()
again = stats.stats(rita, days=7)
client = Client()
client.force_login(rita)
page = client.get("/reviews/stats/")
print(json.dumps({
    "n": figures.overall.n, "p50": figures.overall.p50, "p95": figures.overall.p95,
    "buckets": sum(b.timing.n for b in figures.chart.buckets), "status": page.status_code,
    "chart": 'id="decision-chart"' in page.content.decode(), "streaks": [s.length for s in figures.fatigue],
    "folded": folded, "again": again.overall.n, "bucketed": again.bucketed,
    "again_page": 'id="bucketed"' in client.get("/reviews/stats/").content.decode(),
}))
"""


@pytest.mark.process
def test_the_page_works_on_sqlite(tmp_path: Path) -> None:
    found = on_fresh_sqlite(tmp_path, SCENARIO)
    # 10..200 s and the streak's 20 decisions of 60 s each.
    assert found["n"] == 25 and found["buckets"] == 25
    assert found["p50"] == pytest.approx(60.0)
    assert found["status"] == 200 and found["chart"]
    assert found["streaks"] == [20]
    assert found["folded"] == 26 and found["again"] == 26 and found["bucketed"] and found["again_page"]
