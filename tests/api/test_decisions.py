"""`POST /api/approvals/<id>/decision` beyond yes/no: edited arguments, votes,
separated duties, and expired approvals in the list."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agents.actions.approvals import approval_expire
from agents.actions.runs import run_launch
from agents.models import Approval, LedgerEntry, Run, ToolCall
from agents.runs import driver

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
BIG = {"tool": "ledger_write", "when": {"arg": "entry", "op": "matches", "value": "1000"}, "then": "deny",
       "reason": "no four-figure entries"}
ONE = {"tool": "ledger_write", "then": "ask", "reason": "a human signs the ledger"}


def waiting(users, *, owner: str = "lena", rules: list[dict[str, Any]] | None = None, **policy: Any) -> Approval:
    run = run_launch(
        agent="scripted",
        task="pay ACME",
        user=users[owner],
        script=[{"call": {"tool": "ledger_write", "args": {"entry": "pay ACME 100"}}}, {"final": "paid"}],
        policy={"rules": rules or [BIG, ONE], **policy},
    )
    driver.drive(run.pk)
    return Approval.objects.pending().get(run=run)


def post(api, who: str, approval: Approval, body: dict[str, Any]) -> Any:
    return api(who).post(f"/api/approvals/{approval.pk}/decision", body)


@pytest.mark.django_db
def test_an_edit_with_invalid_arguments_is_400_with_the_schema_error(api, users) -> None:
    approval = waiting(users)
    response = post(api, "rita", approval, {"decision": "approve", "args": {"entry": "x", "extra": 1}})
    assert response.status_code == 400 and response.data["error"] == "invalid_arguments"
    assert "extra" in response.data["detail"]
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.edited_args is None


@pytest.mark.django_db
def test_an_edit_with_a_reject_is_400(api, users) -> None:
    approval = waiting(users)
    response = post(api, "rita", approval, {"decision": "reject", "args": {"entry": "pay ACME 90"}})
    assert response.status_code == 400 and response.data["error"] == "invalid_decision"


@pytest.mark.django_db
def test_an_edit_into_a_denied_call_is_409_naming_the_rule(api, users) -> None:
    approval = waiting(users)
    response = post(api, "rita", approval, {"decision": "approve", "args": {"entry": "pay ACME 1000"}})
    assert response.status_code == 409 and response.data["error"] == "denied_by_policy"
    assert response.data["detail"]["rule"]["reason"] == "no four-figure entries"
    assert "no four-figure entries" in response.data["detail"]["message"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.django_db(transaction=True)  # the ledger tool writes from its own thread and connection
def test_an_edit_executes_once_under_the_new_key_and_the_ledger_holds_the_edited_entry(api, users) -> None:
    approval = waiting(users)
    body = {"decision": "approve", "args": {"entry": "pay ACME 90"}, "note": "the invoice says 90"}
    response = post(api, "rita", approval, body)
    assert response.status_code == 200, response.data
    data = response.data
    assert data["status"] == "approved" and data["decided_by"] == "rita"
    assert data["args"] == {"entry": "pay ACME 100"} and data["edited_args"] == {"entry": "pay ACME 90"}
    assert [(v["by"], v["decision"], v["note"]) for v in data["votes"]] == [("rita", "approve", "the invoice says 90")]
    again = post(api, "rita", approval, body)  # a retried request changes nothing
    assert again.status_code == 200 and again.data["status"] == "approved"

    run = driver.drive(approval.run_id)
    assert run.state == "done"
    [entry] = LedgerEntry.objects.filter(run=run)
    assert entry.entry == "pay ACME 90"
    key = Approval.objects.get(pk=approval.pk).idempotency_key
    assert entry.idempotency_key == key != approval.idempotency_key
    assert ToolCall.objects.filter(run=run).count() == 1
    reply = run.messages.get(role="tool").content
    assert "changed the arguments" in reply and "pay ACME 100" in reply and "pay ACME 90" in reply


@pytest.mark.django_db
def test_the_approval_json_shows_the_votes_and_what_is_missing(api, users) -> None:
    approval = waiting(users, rules=[TWO_PEOPLE])
    first = post(api, "rita", approval, {"decision": "approve", "note": "ok by me"})
    assert first.status_code == 200
    assert first.data["status"] == "pending" and first.data["required"] == 2
    [vote] = first.data["votes"]
    assert (vote["by"], vote["decision"], vote["note"]) == ("rita", "approve", "ok by me") and vote["at"]
    # The same person again gets their vote back; a different answer from them is a 409.
    same = post(api, "rita", approval, {"decision": "approve"})
    assert same.status_code == 200 and same.data["votes"] == first.data["votes"]
    other = post(api, "rita", approval, {"decision": "reject"})
    assert other.status_code == 409 and other.data["error"] == "already_voted"
    listed = api("otto").get("/api/approvals?status=pending").data["items"]
    assert [len(a["votes"]) for a in listed] == [1]
    second = post(api, "rob", approval, {"decision": "approve"})
    assert second.data["status"] == "approved" and [v["by"] for v in second.data["votes"]] == ["rita", "rob"]


@pytest.mark.django_db
def test_a_reject_after_one_approve_rejects(api, users) -> None:
    approval = waiting(users, rules=[TWO_PEOPLE])
    post(api, "rita", approval, {"decision": "approve"})
    response = post(api, "rob", approval, {"decision": "reject", "note": "not this month"})
    assert response.status_code == 200 and response.data["status"] == "rejected"
    assert response.data["decided_by"] == "rob"


@pytest.mark.django_db
@pytest.mark.parametrize("launcher", ["ray", "root"])
def test_the_launcher_gets_403_when_duties_are_separated(api, users, launcher) -> None:
    from tests.helpers import person

    if launcher == "ray":
        users["ray"] = person("ray", "launcher", "reviewer")
    approval = waiting(users, owner=launcher, separate_duties=True)
    response = post(api, launcher, approval, {"decision": "approve"})
    assert response.status_code == 403 and response.data["error"] == "separation_of_duties"
    assert post(api, "rita", approval, {"decision": "approve"}).data["status"] == "approved"


@pytest.mark.django_db
def test_expired_approvals_are_listed_apart_from_rejected_ones(api, users) -> None:
    expired = waiting(users, approval_timeout_seconds=30)
    assert post(api, "rita", expired, {"decision": "approve"}).data["expires_at"]  # approve: one vote needed
    expiring = waiting(users, owner="leo", approval_timeout_seconds=30)
    assert approval_expire(approval_id=expiring.pk, owner="sweeper:test", now=time.time() + 31)
    rejected = waiting(users)
    post(api, "rob", rejected, {"decision": "reject"})

    assert [a["id"] for a in api("rita").get("/api/approvals?status=expired").data["items"]] == [expiring.pk]
    assert [a["id"] for a in api("rita").get("/api/approvals?status=rejected").data["items"]] == [rejected.pk]
    run = api("leo").get(f"/api/runs/{expiring.run_id}").data
    assert run["pending_approval"] is None
    steps = api("leo").get(f"/api/runs/{expiring.run_id}/transitions").data
    [expiry] = [t for t in steps if t["kind"] == "expiry"]
    assert expiry["payload"]["reason"] == "no reviewer answered within 30 s"
    late = post(api, "rob", expiring, {"decision": "approve"})
    assert late.status_code == 409 and late.data["detail"]["approval"]["status"] == "expired"
    assert json.dumps(Run.objects.get(pk=expiring.run_id).state) == '"planning"'
