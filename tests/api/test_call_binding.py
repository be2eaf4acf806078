"""A decision is bound to the call its voter saw (issue 34, item 1): `args_hash` in the
approval JSON and in `POST /api/approvals/<id>/decision`; a call that changed since,
or an edited call the decision does not name, answers 409 `call_changed`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from agents.actions.approvals import approval_decide
from agents.actions.base import ActionError
from agents.actions.runs import run_launch
from agents.models import Approval, ApprovalVote, LedgerEntry, Run
from agents.runs import driver
from tests.helpers import at_once, requires_postgres

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign refunds"}
ORIGINAL = {"entry": "refund 10 EUR to customer 1042"}
ATTACK = {"entry": "refund 10000 EUR to IBAN XX00 ATTACKER"}


def waiting(users, *, rules: list[dict[str, Any]] | None = None) -> Approval:
    run = run_launch(
        agent="scripted",
        task="refund order 1042",
        user=users["lena"],
        script=[{"call": {"tool": "ledger_write", "args": ORIGINAL}}, {"final": "refunded"}],
        policy={"rules": rules or [TWO_PEOPLE]},
    )
    driver.drive(run.pk)
    return Approval.objects.pending().get(run=run)


def sha(args: Any) -> str:
    return hashlib.sha256(
        json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()


def shown(api, who: str, approval: Approval) -> dict[str, Any]:
    """The approval as `who` reads it from the API: what their client renders."""
    [data] = [a for a in api(who).get("/api/approvals?status=pending").data["items"] if a["id"] == approval.pk]
    return data


def post(api, who: str, approval: Approval, body: dict[str, Any]) -> Any:
    return api(who).post(f"/api/approvals/{approval.pk}/decision", body)


def edit(api, approval: Approval, *, by: str = "rob") -> Any:
    seen = shown(api, by, approval)["args_hash"]
    response = post(api, by, approval, {"decision": "approve", "args": ATTACK, "args_hash": seen})
    assert response.status_code == 200 and response.data["status"] == "pending", response.data
    return response


@pytest.mark.django_db
def test_the_approval_json_names_the_hash_of_the_call_that_would_run(api, users) -> None:
    approval = waiting(users)
    before = shown(api, "rita", approval)
    assert before["args_hash"] == sha(ORIGINAL) and before["edited_by"] is None
    edit(api, approval)
    after = shown(api, "rita", approval)
    assert after["args_hash"] == sha(ATTACK) and after["edited_by"] == "rob"
    assert after["args"] == ORIGINAL and after["edited_args"] == ATTACK


@pytest.mark.django_db(transaction=True)  # the ledger tool writes from its own thread and connection
def test_an_approve_bound_to_the_original_call_is_refused_once_another_reviewer_edited_it(api, users) -> None:
    approval = waiting(users)
    seen = shown(api, "rita", approval)["args_hash"]  # rita's client renders the call
    edit(api, approval)  # rob's edit and approval land between her render and her click
    response = post(api, "rita", approval, {"decision": "approve", "args_hash": seen})

    assert response.status_code == 409 and response.data["error"] == "call_changed", response.data
    detail = response.data["detail"]
    assert detail["args"] == ATTACK and detail["edited_by"] == "rob" and detail["args_hash"] == sha(ATTACK)
    assert "rob edited the arguments" in detail["message"]
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert [v.by_name for v in approval.current_votes()] == ["rob"]  # rita's answer was not recorded
    run = driver.drive(approval.run_id)
    assert run.state == "awaiting_approval" and not LedgerEntry.objects.filter(run=run).exists()


@pytest.mark.django_db(transaction=True)
def test_a_plain_approve_never_completes_a_call_someone_edited(api, users) -> None:
    approval = waiting(users)
    edit(api, approval)
    response = post(api, "rita", approval, {"decision": "approve"})  # no args_hash: the old client
    assert response.status_code == 409 and response.data["error"] == "call_changed"
    assert response.data["detail"]["args"] == ATTACK
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.votes.count() == 1
    run = driver.drive(approval.run_id)
    assert run.state == "awaiting_approval" and not LedgerEntry.objects.filter(run=run).exists()


@pytest.mark.django_db(transaction=True)
def test_naming_the_edited_call_approves_it_and_runs_it_once(api, users) -> None:
    approval = waiting(users)
    edit(api, approval)
    now = shown(api, "rita", approval)["args_hash"]
    response = post(api, "rita", approval, {"decision": "approve", "args_hash": now})
    assert response.status_code == 200 and response.data["status"] == "approved", response.data
    again = post(api, "rita", approval, {"decision": "approve", "args_hash": now})  # a double click
    assert again.status_code == 200 and again.data["decided_at"] == response.data["decided_at"]
    run = driver.drive(approval.run_id)
    assert run.state == "done"
    assert [e.entry for e in LedgerEntry.objects.filter(run=run)] == [ATTACK["entry"]]


@pytest.mark.django_db
def test_a_vote_cast_for_the_original_call_does_not_count_for_the_edited_one(api, users) -> None:
    approval = waiting(users)
    seen = shown(api, "rita", approval)["args_hash"]
    first = post(api, "rita", approval, {"decision": "approve", "args_hash": seen})
    assert first.status_code == 200 and [v["by"] for v in first.data["votes"]] == ["rita"]
    edit(api, approval)
    data = shown(api, "rita", approval)
    assert data["status"] == "pending" and [v["by"] for v in data["votes"]] == ["rob"]
    # Her retried request (the same body) is for a call that is no longer the one on offer.
    retried = post(api, "rita", approval, {"decision": "approve", "args_hash": seen})
    assert retried.status_code == 409 and retried.data["error"] == "call_changed"
    assert ApprovalVote.objects.filter(approval=approval, by_name="rita").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"decision": "reject", "note": "no"},
        {"decision": "reject", "args_hash": sha(ORIGINAL)},
        {"decision": "approve", "args": {"entry": "refund 10 EUR to customer 1043"}},
        {"decision": "approve", "args": {"entry": "refund 10 EUR to customer 1043"}, "args_hash": sha(ORIGINAL)},
    ],
)
def test_every_answer_to_a_stale_call_is_refused_and_changes_nothing(api, users, body) -> None:
    approval = waiting(users)
    edit(api, approval)
    response = post(api, "rita", approval, body)
    assert response.status_code == 409 and response.data["error"] == "call_changed", response.data
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.edited_args == ATTACK and approval.round == 1


@pytest.mark.django_db
def test_a_hash_of_another_call_is_refused_even_before_any_edit(api, users) -> None:
    approval = waiting(users, rules=[{**TWO_PEOPLE, "approvals": 1}])
    response = post(api, "rita", approval, {"decision": "approve", "args_hash": sha(ATTACK)})
    assert response.status_code == 409 and response.data["error"] == "call_changed"
    assert response.data["detail"]["args"] == ORIGINAL and response.data["detail"]["edited_by"] is None
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    # Unedited, a decision without a hash still stands for the agent's call.
    plain = post(api, "rita", approval, {"decision": "approve"})
    assert plain.status_code == 200 and plain.data["status"] == "approved"


@pytest.mark.django_db
def test_a_late_answer_is_told_who_decided_whatever_hash_it_names(api, users) -> None:
    approval = waiting(users, rules=[{**TWO_PEOPLE, "approvals": 1}])
    assert post(api, "rob", approval, {"decision": "approve", "args": ATTACK}).data["status"] == "approved"
    # Decided: a repeat of the same answer is the recorded decision, a contradiction a 409.
    same = post(api, "rita", approval, {"decision": "approve", "args_hash": sha(ORIGINAL)})
    assert same.status_code == 200 and same.data["decided_by"] == "rob"
    other = post(api, "rita", approval, {"decision": "reject", "args_hash": sha(ORIGINAL)})
    assert other.status_code == 409 and other.data["error"] == "already_decided"


@pytest.mark.django_db
def test_an_args_hash_that_is_not_text_is_a_400(api, users) -> None:
    approval = waiting(users)
    for junk in (123, "x" * 65):
        response = post(api, "rita", approval, {"decision": "approve", "args_hash": junk})
        assert response.status_code == 400 and response.data["error"] == "invalid_request"


@pytest.mark.django_db
def test_an_empty_args_hash_is_a_400_not_a_mismatch_nor_absent(api, users) -> None:
    """A client that lost the hash it meant to send is told so, and nothing is recorded:
    read as absent it would silently give up the binding it asked for (docs/api.md)."""
    approval = waiting(users)
    response = post(api, "rita", approval, {"decision": "approve", "args_hash": ""})
    assert response.status_code == 400 and response.data["error"] == "invalid_request", response.data
    assert "args_hash" in json.dumps(response.data)
    response = api("rita").post(
        "/api/approvals/decisions", {"ids": [approval.pk], "decision": "approve", "args_hashes": {str(approval.pk): ""}}
    )
    assert response.status_code == 400 and "is empty" in json.dumps(response.data), response.data
    assert not ApprovalVote.objects.filter(approval=approval).exists()


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_an_edit_racing_a_vote_for_the_original_never_lets_that_vote_count(api, users) -> None:
    """Rob edits while Rita approves the call she saw, at the same instant, many times
    over: whichever commits first, Rita's vote never counts for Rob's call."""
    for _ in range(5):
        approval = waiting(users)
        seen = Approval.objects.get(pk=approval.pk).args_hash

        def answer(who: str, approval_id: int = approval.pk, seen: str = seen) -> str:
            try:
                kw: dict[str, Any] = {"args": ATTACK} if who == "rob" else {}
                return approval_decide(
                    approval_id=approval_id, user=users[who], decision="approve", args_hash=seen, **kw
                ).outcome
            except ActionError as exc:
                return exc.code

        outcomes = at_once(answer, ["rob", "rita"])
        assert outcomes[0] == "voted"
        assert outcomes[1] in ("voted", "call_changed"), outcomes
        approval.refresh_from_db()
        assert approval.status == "pending" and [v.by_name for v in approval.current_votes()] == ["rob"]
        assert not LedgerEntry.objects.filter(run=Run.objects.get(pk=approval.run_id)).exists()


@pytest.mark.django_db(transaction=True)
def test_a_reject_naming_the_edited_call_rejects_it(api, users) -> None:
    # Rejecting an edited call used to reach the engine with the edit attached: a 500.
    approval = waiting(users)
    edit(api, approval)
    now = shown(api, "rita", approval)["args_hash"]
    response = post(api, "rita", approval, {"decision": "reject", "note": "not to that IBAN", "args_hash": now})
    assert response.status_code == 200 and response.data["status"] == "rejected", response.data
    run = driver.drive(approval.run_id)
    assert run.state == "done" and not LedgerEntry.objects.filter(run=run).exists()
    assert "not to that IBAN" in run.messages.get(role="tool").content
