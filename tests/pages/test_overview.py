from __future__ import annotations

import pytest

from agents.models import AgentProfile
from tests.helpers import call, client_for, final

pytestmark = pytest.mark.django_db


def test_overview_shows_states_failures_cost_and_newest(launch, drive, otto, lena) -> None:
    AgentProfile.objects.filter(name="scripted").update(price_input_micros=1_000_000)
    drive(launch([final("ok", usage={"input_tokens": 2500, "output_tokens": 0})], user=lena, task="cheap one"))
    drive(launch([call("echo", text="a")], user=lena, task="runs out of script"))
    launch([final()], user=lena, task="still queued")
    html = client_for(otto).get("/").content.decode()
    assert 'state-done">done</span></a></td><td class="num">1<' in html
    assert 'state-failed">failed</span></a></td><td class="num">1<' in html
    assert "script exhausted" in html  # the failure's reason
    assert "$0.0025" in html  # cost today
    assert "still queued" in html and "cheap one" in html


def test_reviewer_sees_pending_approvals_link(launch, drive, lena, rita) -> None:
    drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry="e"), final()], user=lena))
    html = client_for(rita).get("/").content.decode()
    assert 'href="/reviews/"' in html and "1 pending approval →" in html
    assert "<code>ledger_write</code> in <a" in html and "writes and the run has read external content" in html


def test_overview_runs_a_constant_number_of_queries(launch, drive, otto, django_assert_max_num_queries) -> None:
    for i in range(12):
        drive(launch([call("fetch_fixture", text=str(i)), call("ledger_write", entry=str(i))], task=f"t{i}"))
    c = client_for(otto)
    c.get("/runs/")
    # 11: one more than before projects, the navigation's projects (the switcher).
    with django_assert_max_num_queries(11):
        html = c.get("/").content.decode()
    assert "12 pending approvals →" in html


def test_launcher_overview_counts_only_own_runs(launch, lena, leo) -> None:
    launch([final()], user=leo, task="not yours")
    launch([final()], user=lena, task="yours")
    html = client_for(lena).get("/").content.decode()
    assert "yours" in html and "not yours" not in html
    assert "pending approval" not in html  # launchers do not decide


def test_overview_refuses_post(otto) -> None:
    assert client_for(otto, csrf=False).post("/").status_code == 405
