"""`POST /api/approvals/decisions`: several approvals answered in one request, each as
its own single decision; the answer's shape, its validation and every outcome."""

from __future__ import annotations

from typing import Any

import pytest

from agents.actions.runs import run_launch
from agents.models import Approval, ApprovalVote, LedgerEntry, Run, Transition
from agents.runs import driver

URL = "/api/approvals/decisions"
ONE = {"tool": "ledger_write", "then": "ask", "reason": "a human signs the ledger"}
TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}


def waiting(users: dict[str, Any], entry: str = "refund 10", *, owner: str = "lena", **policy: Any) -> Approval:
    run = run_launch(
        agent="scripted", task=f"refund: {entry}", user=users[owner],
        script=[{"call": {"tool": "ledger_write", "args": {"entry": entry}}}, {"final": "refunded"}],
        policy={"rules": [ONE], **policy},
    )
    driver.drive(run.pk)
    return Approval.objects.pending().get(run=run)


def outcomes(response: Any) -> list[tuple[int, str]]:
    return [(r["id"], r["outcome"]) for r in response.data["results"]]


@pytest.mark.django_db(transaction=True)  # the ledger tool writes from its own thread and connection
def test_a_batch_decides_each_id_with_its_own_transition_and_runs_each_call_once(api, users) -> None:
    a, b, c = (waiting(users, f"refund {n}") for n in (10, 20, 30))
    response = api("rita").post(URL, {"ids": [c.pk, a.pk], "decision": "approve", "note": "all checked"})
    assert response.status_code == 200
    assert outcomes(response) == [(c.pk, "decided"), (a.pk, "decided")]  # the order given
    assert [r["detail"] for r in response.data["results"]] == ["approved", "approved"]
    assert set(response.data["results"][0]) == {"id", "outcome", "detail"}
    for approval in (a, c):
        approval.refresh_from_db()
        assert (approval.status, approval.decided_by.username, approval.note, approval.via) == (
            "approved", "rita", "all checked", "api")
        assert Transition.objects.filter(run_id=approval.run_id, kind="decision").count() == 1
        run = driver.drive(approval.run_id)
        assert run.state == "done", run.error
        assert LedgerEntry.objects.filter(run=run).count() == 1
    assert Approval.objects.get(pk=b.pk).status == "pending"  # not named: untouched


@pytest.mark.django_db
def test_a_rejection_batch_rejects_with_the_note(api, users) -> None:
    a = waiting(users)
    response = api("rob").post(URL, {"ids": [a.pk], "decision": "reject", "note": "duplicate refund"})
    assert outcomes(response) == [(a.pk, "decided")] and response.data["results"][0]["detail"] == "rejected"
    a.refresh_from_db()
    assert (a.status, a.note) == ("rejected", "duplicate refund")


@pytest.mark.django_db
def test_already_decided_ids_say_who_decided_and_change_nothing(api, users) -> None:
    a, b = waiting(users, "refund 1"), waiting(users, "refund 2")
    api("rob").post(f"/api/approvals/{a.pk}/decision", {"decision": "reject"})
    response = api("rita").post(URL, {"ids": [a.pk, b.pk], "decision": "approve"})
    assert outcomes(response) == [(a.pk, "already_decided"), (b.pk, "decided")]
    assert response.data["results"][0]["detail"] == "rejected by rob"
    assert Approval.objects.get(pk=a.pk).status == "rejected"
    # The same batch again (a retry): nothing is decided twice.
    again = api("rita").post(URL, {"ids": [a.pk, b.pk], "decision": "approve"})
    assert outcomes(again) == [(a.pk, "already_decided"), (b.pk, "already_decided")]
    assert again.data["results"][1]["detail"] == "approved by rita"
    assert Transition.objects.filter(kind="decision").count() == 2


@pytest.mark.django_db
def test_the_launcher_is_refused_where_duties_are_separated_and_others_are_decided(api, users) -> None:
    users["lena"].groups.add(users["rita"].groups.get(name="reviewer"))
    own = waiting(users, "refund 1", separate_duties=True)
    other = waiting(users, "refund 2", owner="leo", separate_duties=True)
    response = api("lena").post(URL, {"ids": [own.pk, other.pk], "decision": "approve"})
    assert outcomes(response) == [(own.pk, "refused"), (other.pk, "decided")]
    assert response.data["results"][0]["detail"].startswith("separation_of_duties: you launched this run")
    assert Approval.objects.get(pk=own.pk).status == "pending"
    assert not ApprovalVote.objects.filter(approval=own).exists()


@pytest.mark.django_db
def test_a_two_person_rule_records_the_vote_and_waits(api, users) -> None:
    a = waiting(users, rules=[TWO_PEOPLE])
    first = api("rita").post(URL, {"ids": [a.pk], "decision": "approve"})
    assert outcomes(first) == [(a.pk, "needs_more_votes")]
    assert first.data["results"][0]["detail"] == "vote recorded: 1 of 2 approvals"
    again = api("rita").post(URL, {"ids": [a.pk], "decision": "approve"})  # a retry counts once
    assert outcomes(again) == [(a.pk, "needs_more_votes")]
    assert ApprovalVote.objects.filter(approval=a).count() == 1
    turned = api("rita").post(URL, {"ids": [a.pk], "decision": "reject"})
    assert outcomes(turned) == [(a.pk, "refused")]
    assert turned.data["results"][0]["detail"] == "you already voted approve in this round"
    second = api("rob").post(URL, {"ids": [a.pk], "decision": "approve"})
    assert outcomes(second) == [(a.pk, "decided")]
    assert Approval.objects.get(pk=a.pk).status == "approved"


@pytest.mark.django_db
def test_a_changed_call_is_refused_and_a_matching_hash_is_decided(api, users) -> None:
    a, b = waiting(users, "refund 1"), waiting(users, "refund 2")
    body = {"ids": [a.pk, b.pk], "decision": "approve", "args_hashes": {str(a.pk): "0" * 64, str(b.pk): b.args_hash}}
    response = api("rita").post(URL, body)
    assert outcomes(response) == [(a.pk, "refused"), (b.pk, "decided")]
    assert response.data["results"][0]["detail"].startswith("call_changed: not recorded")
    assert Approval.objects.get(pk=a.pk).status == "pending"


@pytest.mark.django_db
def test_an_id_that_names_no_approval_is_refused_not_found(api, users) -> None:
    a = waiting(users)
    missing = a.pk + 1000
    response = api("rita").post(URL, {"ids": [missing, a.pk], "decision": "approve"})
    assert response.data["results"][0] == {"id": missing, "outcome": "refused", "detail": "not found"}
    assert outcomes(response)[1] == (a.pk, "decided")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"ids": [], "decision": "approve"}, "at least 1"),
        ({"ids": list(range(1, 202)), "decision": "approve"}, "at most 200"),
        ({"ids": [3, 3], "decision": "approve"}, "3 appears more than once"),
        ({"ids": [0], "decision": "approve"}, "0 is not an approval id"),
        ({"ids": [-4], "decision": "approve"}, "-4 is not an approval id"),
        ({"ids": ["7"], "decision": "approve"}, "valid integer"),
        ({"ids": [True], "decision": "approve"}, "valid integer"),
        ({"ids": 7, "decision": "approve"}, "valid list"),
        ({"ids": [7], "decision": "happened"}, "'approve' or 'reject'"),
        ({"ids": [7]}, "Field required"),
        ({"ids": [7], "decision": "approve", "note": 5}, "valid string"),
        ({"ids": [7], "decision": "approve", "args": {"entry": "x"}}, "Extra inputs"),
        ({"ids": [7], "decision": "approve", "remember": "tool"}, "Extra inputs"),
        ({"ids": [7], "decision": "approve", "args_hashes": {"8": "abc"}}, "'8', which is not one of the ids"),
    ],
)
def test_a_malformed_batch_is_a_400_naming_the_problem_and_decides_nothing(api, users, body, says) -> None:
    before = Transition.objects.count()
    response = api("rita").post(URL, body)
    assert response.status_code == 400, response.data
    assert response.data["error"] == "invalid_request"
    assert says in str(response.data["detail"])
    assert Transition.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize(("who", "status"), [(None, 401), ("nina", 403), ("lena", 403), ("otto", 403)])
def test_only_reviewers_decide_batches(api, users, who, status) -> None:
    a = waiting(users)
    response = api(who).post(URL, {"ids": [a.pk], "decision": "approve"})
    assert response.status_code == status
    assert Approval.objects.get(pk=a.pk).status == "pending"
    assert Run.objects.get(pk=a.run_id).state == "awaiting_approval"


@pytest.mark.django_db
def test_get_is_a_json_405(api, users) -> None:
    response = api("rita").get(URL)
    assert response.status_code == 405 and response.data["error"] == "method_not_allowed"
