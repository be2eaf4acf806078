"""GET /api/approvals and POST /api/approvals/<id>/decision: roles, repeats, conflicts, races."""

from __future__ import annotations

import json

import pytest

from agents.models import Approval, Message, Run
from agents.runs import driver
from tests.helpers import at_once, launch_body, requires_postgres, tainted_write

APPROVAL_FIELDS = {
    "id",
    "run",
    "status",
    "tool",
    "args",
    "reason",
    "taint_source",
    "rule",
    "history",
    "decided_by",
    "decided_at",
    "note",
    "created_at",
    # Decisions beyond yes/no (design: Policy and decisions, second round).
    "kind",
    "risk",
    "required",
    "votes",
    "edited_args",
    "expires_at",
    # Decisions bound to the call the voter saw (issue 34): send args_hash back.
    "edited_by",
    "args_hash",
    # Where the deciding answer came from: dashboard, api, slack or email.
    "via",
    # What the profile's shadow rules would have decided.
    "shadow",
    # A fork's "already ran" approval: the parent's call (docs/retry.md).
    "prior",
    # Who is on it ("I'm on it", issue 28): a live claim, or both null.
    "claimed_by",
    "claimed_until",
    # When, and to which backup group, the sweeper escalated the call (issue 28).
    "escalated_at",
    "escalated_to",
}


def paused_run(api, owner: str = "lena") -> tuple[int, int]:
    run_id = api(owner).post("/api/runs", launch_body(tainted_write())).data["id"]
    driver.drive(run_id)
    return run_id, Approval.objects.get(run_id=run_id, status="pending").pk


@pytest.mark.django_db
def test_reviewer_lists_pending_approvals_with_their_fields(api) -> None:
    run_id, approval_id = paused_run(api)
    response = api("rita").get("/api/approvals?status=pending")
    assert response.status_code == 200
    assert response.data["next"] is None
    [approval] = response.data["items"]
    assert set(approval) == APPROVAL_FIELDS
    assert approval["id"] == approval_id and approval["run"] == run_id and approval["status"] == "pending"
    assert approval["tool"] == "ledger_write" and approval["decided_by"] is None
    assert approval["reason"] == "ledger_write writes and the run has read external content"
    assert api("rita").get("/api/approvals?status=approved").data == {"items": [], "next": None}
    assert [a["id"] for a in api("rita").get("/api/approvals").data["items"]] == [approval_id]


@pytest.mark.django_db
def test_launchers_see_approvals_of_their_own_runs_only(api) -> None:
    _, mine = paused_run(api, "lena")
    _, theirs = paused_run(api, "leo")
    assert [a["id"] for a in api("lena").get("/api/approvals?status=pending").data["items"]] == [mine]
    assert [a["id"] for a in api("otto").get("/api/approvals?status=pending").data["items"]] == [mine, theirs]
    assert api("nina").get("/api/approvals?status=pending").status_code == 403  # no role
    assert api(None).get("/api/approvals?status=pending").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["status=maybe", "limit=0", "limit=x", "limit=201"])
def test_bad_approval_query_is_400(api, query) -> None:
    response = api("rita").get(f"/api/approvals?{query}")
    assert response.status_code == 400 and response.data["error"] == "invalid_filter"
    assert response.data["detail"]["field"] == query.split("=")[0]


@pytest.mark.django_db(transaction=True)  # tools write from their own thread and connection
def test_reviewer_approves_and_the_call_runs_once(api) -> None:
    run_id, approval_id = paused_run(api)
    response = api("rita").post(f"/api/approvals/{approval_id}/decision", {"decision": "approve", "note": "fine"})
    assert response.status_code == 200
    assert response.data["status"] == "approved" and response.data["decided_by"] == "rita"
    assert response.data["note"] == "fine" and response.data["decided_at"]
    run = driver.drive(run_id)
    assert run.state == "done" and run.ledger.count() == 1
    assert run.transitions.get(kind="decision").actor == "user:rita"


@pytest.mark.django_db
def test_rejection_reaches_the_model_as_a_tool_result(api) -> None:
    run_id, approval_id = paused_run(api)
    response = api("rita").post(
        f"/api/approvals/{approval_id}/decision", {"decision": "reject", "note": "no mass email"}
    )
    assert response.status_code == 200 and response.data["status"] == "rejected"
    run = driver.drive(run_id)
    assert run.state == "done" and run.ledger.count() == 0
    result = json.loads(Message.objects.filter(run=run, role="tool").order_by("-index").first().content)
    assert result["error"] == "not_permitted" and "no mass email" in result["detail"]


@pytest.mark.django_db
def test_answering_again_returns_the_recorded_decision(api) -> None:
    _, approval_id = paused_run(api)
    first = api("rita").post(f"/api/approvals/{approval_id}/decision", {"decision": "approve", "note": "first"})
    again = api("rob").post(f"/api/approvals/{approval_id}/decision", {"decision": "approve", "note": "second"})
    assert again.status_code == 200
    assert again.data == first.data  # rob is told rita decided; nothing changed
    assert again.data["decided_by"] == "rita" and again.data["note"] == "first"


@pytest.mark.django_db
def test_contradicting_answer_is_a_conflict_naming_who_decided(api) -> None:
    run_id, approval_id = paused_run(api)
    api("rita").post(f"/api/approvals/{approval_id}/decision", {"decision": "approve"})
    response = api("rob").post(f"/api/approvals/{approval_id}/decision", {"decision": "reject"})
    assert response.status_code == 409 and response.data["error"] == "already_decided"
    assert "rita" in response.data["detail"]["message"]
    assert response.data["detail"]["approval"]["status"] == "approved"
    assert Approval.objects.get(pk=approval_id).status == "approved"
    assert Run.objects.get(pk=run_id).transitions.filter(kind="decision").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "who,status", [("rita", 200), ("root", 200), ("lena", 403), ("otto", 403), ("nina", 403), (None, 401)]
)
def test_who_may_decide(api, who, status) -> None:
    _, approval_id = paused_run(api)
    response = api(who).post(f"/api/approvals/{approval_id}/decision", {"decision": "approve"})
    assert response.status_code == status
    assert Approval.objects.get(pk=approval_id).status == ("approved" if status == 200 else "pending")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body,code",
    [
        ({"decision": "maybe"}, "invalid_request"),
        ({"decision": "approve", "note": 3}, "invalid_request"),
        ({}, "invalid_request"),
        ({"decision": "happened"}, "invalid_decision"),
    ],
)
def test_invalid_decision_is_400(api, body, code) -> None:
    _, approval_id = paused_run(api)
    response = api("rita").post(f"/api/approvals/{approval_id}/decision", body)
    assert response.status_code == 400 and response.data["error"] == code
    assert Approval.objects.get(pk=approval_id).status == "pending"


@pytest.mark.django_db
def test_decision_on_unknown_approval_is_404(api) -> None:
    response = api("rita").post("/api/approvals/999999/decision", {"decision": "approve"})
    assert response.status_code == 404 and response.data["error"] == "not_found"


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_two_reviewers_deciding_at_once_through_the_api_execute_once(api) -> None:
    run_id, approval_id = paused_run(api)
    clients = [api("rita"), api("rob"), api("root")]
    responses = at_once(lambda c: c.post(f"/api/approvals/{approval_id}/decision", {"decision": "approve"}), clients)
    assert [r.status_code for r in responses] == [200, 200, 200]
    deciders = {r.data["decided_by"] for r in responses}
    assert len(deciders) == 1  # everyone is told the same winner
    run = driver.drive(run_id)
    assert run.state == "done" and run.ledger.count() == 1
    assert run.transitions.filter(kind="decision").count() == 1
    assert run.transitions.get(kind="decision").actor == f"user:{deciders.pop()}"


@pytest.mark.django_db
def test_a_conflict_shows_the_approval_as_the_api_does_with_iso_times(api) -> None:
    _, approval_id = paused_run(api)
    first = api("rita").post(f"/api/approvals/{approval_id}/decision", {"decision": "reject", "note": "no"})
    conflict = api("rob").post(f"/api/approvals/{approval_id}/decision", {"decision": "approve"})
    assert conflict.status_code == 409
    assert conflict.data["detail"]["message"] == "already rejected by rita"
    assert conflict.data["detail"]["approval"] == first.data
    decided_at = conflict.data["detail"]["approval"]["decided_at"]
    assert "T" in decided_at and decided_at.endswith("Z"), decided_at
