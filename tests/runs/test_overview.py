from __future__ import annotations

import pytest

from agents.models import AgentProfile
from tests.conftest import call, final
from tests.runs.conftest import client_for

pytestmark = pytest.mark.django_db


def test_overview_shows_states_failures_cost_and_newest(launch, drive, operator, launcher) -> None:
    AgentProfile.objects.filter(name="scripted").update(price_input_micros=1_000_000)
    drive(launch([final("ok", usage={"input_tokens": 2500, "output_tokens": 0})], user=launcher, task="cheap one"))
    drive(launch([call("echo", text="a")], user=launcher, task="runs out of script"))
    launch([final()], user=launcher, task="still queued")
    html = client_for(operator).get("/").content.decode()
    assert 'state-done">done</span></a></td><td class="num">1<' in html
    assert 'state-failed">failed</span></a></td><td class="num">1<' in html
    assert "script exhausted" in html  # the failure's reason
    assert "$0.0025" in html  # cost today
    assert "still queued" in html and "cheap one" in html


def test_reviewer_sees_pending_approvals_link(launch, drive, launcher, reviewer) -> None:
    drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry="e"), final()], user=launcher))
    html = client_for(reviewer).get("/").content.decode()
    assert 'href="/reviews/"' in html and "1 pending approval →" in html
    assert "<code>ledger_write</code> in <a" in html and "writes and the run has read external content" in html


def test_overview_runs_a_constant_number_of_queries(launch, drive, operator, django_assert_max_num_queries) -> None:
    for i in range(12):
        drive(launch([call("fetch_fixture", text=str(i)), call("ledger_write", entry=str(i))], task=f"t{i}"))
    c = client_for(operator)
    c.get("/runs/")
    with django_assert_max_num_queries(10):
        html = c.get("/").content.decode()
    assert "12 pending approvals →" in html


def test_launcher_overview_counts_only_own_runs(launch, launcher, other_launcher) -> None:
    launch([final()], user=other_launcher, task="not yours")
    launch([final()], user=launcher, task="yours")
    html = client_for(launcher).get("/").content.decode()
    assert "yours" in html and "not yours" not in html
    assert "pending approval" not in html  # launchers do not decide


def test_overview_refuses_post(operator) -> None:
    assert client_for(operator, csrf=False).post("/").status_code == 405
