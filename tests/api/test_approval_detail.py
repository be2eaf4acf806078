"""GET /api/approvals/<id>: one approval, as an item of the list; 404 outside the caller's reach."""

from __future__ import annotations

import pytest

from agents.actions.tokens import token_create
from tests.api.test_approvals import paused_run
from tests.helpers import Api, tainted_write


@pytest.mark.django_db
def test_one_approval_is_the_same_object_as_its_list_item(api) -> None:
    _, approval_id = paused_run(api)
    [item] = api("rita").get("/api/approvals?status=pending").data["items"]
    response = api("rita").get(f"/api/approvals/{approval_id}")
    assert response.status_code == 200
    assert response.data == item
    # Decided, it is still there, with its decision.
    api("rita").post(f"/api/approvals/{approval_id}/decision", {"decision": "reject", "note": "no"})
    decided = api("rita").get(f"/api/approvals/{approval_id}").data
    assert decided["status"] == "rejected" and decided["decided_by"] == "rita" and decided["note"] == "no"


@pytest.mark.django_db
def test_another_launchers_approval_and_an_unknown_id_are_the_same_404(api) -> None:
    _, theirs = paused_run(api, "leo")
    for path in (f"/api/approvals/{theirs}", "/api/approvals/999999", "/api/approvals/0"):
        response = api("lena").get(path)
        assert response.status_code == 404 and response.data["error"] == "not_found", path
    assert api("leo").get(f"/api/approvals/{theirs}").status_code == 200
    assert api("nina").get(f"/api/approvals/{theirs}").status_code == 403
    assert api(None).get(f"/api/approvals/{theirs}").status_code == 401


@pytest.mark.django_db
def test_another_projects_approval_is_a_404(teams, launch, drive) -> None:
    run = drive(launch(tainted_write(), agent="support-bot", user=teams["support"]["launcher"]))
    approval = run.approvals.get()
    ours = Api(token_create(user=teams["support"]["reviewer"])[1])
    theirs = Api(token_create(user=teams["finance"]["reviewer"])[1])
    assert ours.get(f"/api/approvals/{approval.pk}").data["id"] == approval.pk
    assert theirs.get(f"/api/approvals/{approval.pk}").status_code == 404


@pytest.mark.django_db
def test_the_api_docs_list_it(api) -> None:
    schema = api("rita").get("/api/openapi.json").data
    assert "get" in schema["paths"]["/api/approvals/{approval_id}"]
