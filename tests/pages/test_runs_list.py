from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents.models import AgentProfile, Run
from tests.helpers import call, client_for, final

pytestmark = pytest.mark.django_db


def many_runs(n: int, *, user: User | None = None, **fields) -> list[Run]:
    """Rows as the store leaves them, inserted in bulk: the list reads only Run rows."""
    profile = AgentProfile.objects.get(name="scripted")
    now = timezone.now()
    rows = [
        Run(
            profile=profile,
            task=fields.get("task", f"bulk task {i}"),
            created_by=user,
            deadline=now,
            state=fields.get("state", "done"),
            steps=i % 7,
            cost_micros=i * 10,
            tokens=i * 3,
            tainted=fields.get("tainted", False),
        )
        for i in range(n)
    ]
    return Run.objects.bulk_create(rows)


def run_ids(html: bytes) -> list[int]:
    return [int(x) for x in re.findall(rb'href="/runs/(\d+)/"', html)]


def test_list_needs_login(client) -> None:
    response = client.get("/runs/")
    assert response.status_code == 302 and response.url.startswith("/login/")


def test_operator_sees_every_run_newest_first(launch, otto, lena, leo) -> None:
    a = launch([final()], user=lena, task="alpha")
    b = launch([final()], user=leo, task="bravo")
    response = client_for(otto).get("/runs/")
    assert response.status_code == 200
    assert run_ids(response.content) == [b.pk, a.pk]
    assert b"state state-queued" in response.content


def test_launcher_sees_only_own_runs(launch, lena, leo) -> None:
    mine = launch([final()], user=lena, task="mine")
    theirs = launch([final()], user=leo, task="theirs")
    response = client_for(lena).get("/runs/")
    assert run_ids(response.content) == [mine.pk]
    assert str(theirs.pk).encode() + b"/" not in response.content


def test_user_without_group_sees_no_runs(launch, lena, nina) -> None:
    launch([final()], user=lena)
    response = client_for(nina).get("/runs/")
    assert response.status_code == 200 and run_ids(response.content) == []
    assert b"No runs yet." in response.content


def test_list_shows_columns(launch, drive, otto) -> None:
    run = launch(
        [call("fetch_fixture", text="hi", usage={"input_tokens": 120, "output_tokens": 30}), final("ok")], user=otto
    )
    drive(run)
    html = client_for(otto).get("/runs/").content.decode()
    assert "state-done" in html and ">tainted<" in html and ">150<" in html and "scripted" in html


def test_filter_by_state_agent_taint_and_search(defaults, otto) -> None:
    many_runs(3, state="failed", task="invoice reconciliation")
    many_runs(2, state="done", tainted=True, task="weather report")
    c = client_for(otto)
    assert len(run_ids(c.get("/runs/?state=failed").content)) == 3
    assert len(run_ids(c.get("/runs/?tainted=yes").content)) == 2
    assert len(run_ids(c.get("/runs/?tainted=no").content)) == 3
    assert len(run_ids(c.get("/runs/?q=INVOICE").content)) == 3
    assert len(run_ids(c.get("/runs/?q=weather&state=failed").content)) == 0
    assert len(run_ids(c.get("/runs/?agent=scripted").content)) == 5
    assert len(run_ids(c.get("/runs/?agent=demo").content)) == 0
    assert b"No runs match these filters." in c.get("/runs/?agent=demo").content


def test_filter_by_date_range(defaults, otto) -> None:
    old, new = many_runs(2)
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=10))
    c = client_for(otto)
    today = timezone.now().date()
    since = (today - dt.timedelta(days=1)).isoformat()
    until = (today - dt.timedelta(days=5)).isoformat()
    assert run_ids(c.get(f"/runs/?since={since}").content) == [new.pk]
    assert run_ids(c.get(f"/runs/?until={until}").content) == [old.pk]


def test_a_bad_filter_value_is_named_not_answered_with_no_runs_match(defaults, otto) -> None:
    many_runs(2)
    c = client_for(otto)
    response = c.get("/runs/?state=bogus&since=yesterday&agent=demoo&before=garbage")
    html = response.content.decode()
    assert response.status_code == 400 and run_ids(response.content) == []
    alert = html[html.index('id="filter-problems"') : html.index("</div>", html.index('id="filter-problems"'))]
    assert "These filters are wrong, so no runs are shown:" in alert
    assert "State “bogus”: Select a valid choice. bogus is not one of the available choices." in alert
    assert "Agent “demoo”: there is no agent profile named “demoo”" in alert
    assert "From “yesterday”: Enter a valid date." in alert
    assert "No runs match these filters." not in html
    # A garbled page cursor is not a filter: the first page, as without it.
    assert len(run_ids(c.get("/runs/?before=garbage").content)) == 2


def test_pagination_walks_every_run_once_in_both_directions(defaults, otto) -> None:
    rows = many_runs(120)
    # Same timestamp for all: the id breaks ties, so no run is skipped or repeated.
    Run.objects.update(created_at=timezone.now())
    c = client_for(otto)
    seen: list[int] = []
    pages = []
    url = "/runs/?state=done"
    while url:
        html = c.get(url).content.decode()
        pages.append(url)
        seen += run_ids(html.encode())
        m = re.search(r'href="(\?[^"]*before=[^"]+)" rel="next"', html)
        url = "/runs/" + m.group(1).replace("&amp;", "&") if m else None
    assert len(pages) == 3
    assert seen == sorted((r.pk for r in rows), reverse=True)
    html = c.get(pages[-1]).content.decode()
    back = re.search(r'href="(\?[^"]*after=[^"]+)" rel="prev"', html).group(1).replace("&amp;", "&")
    assert "state=done" in back
    assert run_ids(c.get("/runs/" + back).content) == seen[50:100]


def test_list_runs_a_constant_number_of_queries(defaults, otto, django_assert_max_num_queries) -> None:
    many_runs(300)
    c = client_for(otto)
    c.get("/runs/")  # warm the session
    # 7: the session, the user, its groups and memberships (once a request), the profiles,
    # the navigation's projects (the switcher) and the page of runs, however many there are.
    with django_assert_max_num_queries(7):
        response = c.get("/runs/?tainted=no&q=bulk")
    assert len(run_ids(response.content)) == 50


def test_list_refuses_post(otto) -> None:
    assert client_for(otto, csrf=False).post("/runs/").status_code == 405


def test_a_parameter_that_is_no_filter_is_named_not_ignored(defaults, otto) -> None:
    many_runs(2)
    c = client_for(otto)
    response = c.get("/runs/?from=garbage")
    html = response.content.decode()
    assert response.status_code == 400 and run_ids(response.content) == []
    assert "“from” is not a filter of this list; the filters are q, state, agent, tainted, since, until." in html
    # The cursors and the project switcher's parameter are not filters and pass quietly.
    assert c.get("/runs/?before=garbage&after=garbage&project=").status_code == 200
