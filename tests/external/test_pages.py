"""An external agent's calls appear where every run's do: the review queue and the
timeline, as inert text."""

from __future__ import annotations

import pytest

from tests.helpers import client_for

pytestmark = pytest.mark.django_db

ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}


def test_a_held_client_tool_call_is_in_the_queue_and_on_the_timeline(api, users, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM]})
    note = "<script>alert(1)</script>"
    held = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "ACME", "note": note}})
    approval_id = held.data["approval"]["id"]
    queue = client_for(users["rita"]).get("/reviews/").content.decode()
    assert f'data-approval-id="{approval_id}"' in queue and "crm_update" in queue
    assert note not in queue and "&lt;script&gt;" in queue
    timeline = client_for(users["lena"]).get(f"/runs/{run_id}/")
    assert timeline.status_code == 200
    page = timeline.content.decode()
    assert "crm_update" in page and "a human reads CRM notes first" in page and note not in page
