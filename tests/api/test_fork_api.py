"""POST /api/runs/<id>/fork, /api/runs/<id>/retry and /api/runs/retry (docs/api.md), and
the `reuse` decision on a fork's "already ran" approval."""

from __future__ import annotations

import pytest

from agents.models import Approval, LedgerEntry, Run
from agents.runs.retention import purge
from tests.helpers import call, final

pytestmark = pytest.mark.django_db


def pickup(run: Run) -> int:
    return run.transitions.get(kind="pickup").seq


def test_an_operator_forks_a_run_and_gets_its_json(api, launch, drive, otto) -> None:
    parent = drive(launch([call("echo", text="a"), final("done")]))
    response = api("otto").post(f"/api/runs/{parent.pk}/fork", {"from_seq": pickup(parent), "note": "try again"})
    assert response.status_code == 201, response.data
    body = response.data
    assert body["forked_from"] == {"run": parent.pk, "seq": pickup(parent)}
    assert body["fork_point"] is None and body["state"] == "queued" and body["agent"] == "scripted"
    child = Run.objects.get(pk=body["id"])
    assert child.created_by == otto and child.forked_from == parent
    assert api("otto").get(f"/api/runs/{child.pk}").data["forked_from"] == body["forked_from"]
    assert api("otto").get(f"/api/runs/{parent.pk}").data["forked_from"] is None


def test_a_seq_inside_a_call_answers_the_resting_point_used(api, launch, drive) -> None:
    parent = drive(launch([call("echo", text="a"), final("done")]))
    inside = parent.transitions.get(kind="model", to_state="acting").seq
    response = api("otto").post(f"/api/runs/{parent.pk}/fork", {"from_seq": inside})
    assert response.status_code == 201
    point = response.data["fork_point"]
    assert point["requested"] == inside and point["used"] == inside - 1 and "not a resting point" in point["why"]
    assert response.data["forked_from"]["seq"] == inside - 1


@pytest.mark.parametrize(
    ("who", "status"),
    [("leo", 404), ("rita", 403), ("nina", 404), ("lena", 201), ("otto", 201), ("root", 201)],
)
def test_who_may_fork_lenas_run(api, launch, drive, lena, who, status) -> None:
    parent = drive(launch([final("done")], user=lena))
    response = api(who).post(f"/api/runs/{parent.pk}/fork", {"from_seq": 2})
    assert response.status_code == status, response.data
    assert Run.objects.filter(forked_from=parent).exists() == (status == 201)


def test_forking_needs_a_token(api, launch, drive) -> None:
    parent = drive(launch([final("done")]))
    assert api(None).post(f"/api/runs/{parent.pk}/fork", {"from_seq": 2}).status_code == 401


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"from_seq": 99}, "invalid_fork_point"),
        ({"from_seq": 0}, "invalid_fork_point"),
        ({"from_seq": 2, "reuse": "sometimes"}, "invalid_reuse"),
        ({"from_seq": 2, "limits": {"max_steps": 500}}, "invalid_limits"),
        ({"from_seq": "2"}, None),
        ({}, None),
        ({"from_seq": 2, "colour": "red"}, None),
    ],
)
def test_bad_fork_requests_are_clear_400s(api, launch, drive, body, code) -> None:
    parent = drive(launch([final("done")]))
    response = api("otto").post(f"/api/runs/{parent.pk}/fork", body)
    assert response.status_code == 400, response.data
    assert "error" in response.data
    if code:
        assert response.data["error"] == code
    assert not Run.objects.filter(forked_from=parent).exists()


def test_a_purged_run_cannot_be_forked(api, launch, drive) -> None:
    parent = drive(launch([final("done")]))
    purge(actor="test", only=[parent.pk], older_than_days=0)
    response = api("otto").post(f"/api/runs/{parent.pk}/fork", {"from_seq": 2})
    assert response.status_code == 400 and response.data["error"] == "purged"


def test_a_live_run_is_a_409_that_says_to_cancel_or_wait(api, launch, drive) -> None:
    parent = drive(launch([call("ledger_write_unsafe", entry="PAY 100 EUR"), final("done")]), max_transitions=2)
    assert parent.state == "acting"
    response = api("otto").post(f"/api/runs/{parent.pk}/fork", {"from_seq": 2})
    assert response.status_code == 409
    assert response.data["error"] == "parent_live"
    assert "cancel it, or wait for it to end" in response.data["detail"]
    assert Run.objects.filter(forked_from=parent).count() == 0


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_the_reuse_decision_through_the_api(api, launch, drive) -> None:
    parent = drive(launch([call("ledger_write_unsafe", entry="wire $5"), final("done")]))
    fork = api("otto").post(f"/api/runs/{parent.pk}/fork", {"from_seq": pickup(parent)}).data
    child = drive(Run.objects.get(pk=fork["id"]))
    pending = api("rita").get(f"/api/runs/{child.pk}").data["pending_approval"]
    step = parent.transitions.get(kind="tool").seq
    assert pending["kind"] == "already_ran"
    assert pending["reason"] == f"this exact call already ran in run #{parent.pk} at step {step}"
    assert pending["prior"] == {"run": parent.pk, "seq": step, "status": "succeeded"}
    answer = api("rita").post(f"/api/approvals/{pending['id']}/decision", {"decision": "reuse"})
    assert answer.status_code == 200, answer.data
    assert answer.data["status"] == "approved"
    assert drive(child).state == "done"
    assert LedgerEntry.objects.count() == 1


def test_reuse_on_a_policy_approval_is_a_400(api, pending) -> None:
    approval = pending()
    response = api("rita").post(f"/api/approvals/{approval.pk}/decision", {"decision": "reuse"})
    assert response.status_code == 400 and response.data["error"] == "invalid_decision"
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_retry_one_run(api, launch, drive) -> None:
    failed = drive(launch([call("echo", text="a")]))
    done = drive(launch([final("done")]))
    response = api("otto").post(f"/api/runs/{failed.pk}/retry", {"limits": {"max_steps": 10}})
    assert response.status_code == 201, response.data
    assert response.data["forked_from"] == {"run": failed.pk, "seq": failed.version - 1}
    assert Run.objects.get(pk=response.data["id"]).engine["limits"]["max_steps"] == 10
    refused = api("otto").post(f"/api/runs/{done.pk}/retry")
    assert refused.status_code == 409 and refused.data["error"] == "not_failed"
    again = api("otto").post(f"/api/runs/{failed.pk}/retry")
    assert again.status_code == 409 and again.data["error"] == "already_retried"


def test_bulk_retry_answers_each_id(api, launch, drive, lena, leo) -> None:
    mine = drive(launch([call("echo", text="a")], user=lena))
    theirs = drive(launch([call("echo", text="a")], user=leo))
    done = drive(launch([final("done")], user=lena))
    response = api("lena").post("/api/runs/retry", {"ids": [mine.pk, theirs.pk, done.pk, 10**9, mine.pk]})
    assert response.status_code == 200, response.data
    results = {r["id"]: r for r in response.data["results"]}
    assert list(results) == [mine.pk, theirs.pk, done.pk, 10**9]  # a repeated id answered once
    assert results[mine.pk]["outcome"] == "retried" and Run.objects.get(pk=results[mine.pk]["run"]).forked_from == mine
    assert results[theirs.pk]["outcome"] == "not_found"  # lena cannot read leo's run
    assert results[done.pk]["outcome"] == "refused" and "only a failed run" in results[done.pk]["detail"]
    assert results[10**9]["outcome"] == "not_found"
    assert not Run.objects.filter(forked_from=theirs).exists()


def test_bulk_retry_takes_at_most_200_ids_and_needs_a_role(api, defaults) -> None:
    assert api("otto").post("/api/runs/retry", {"ids": list(range(1, 202))}).status_code == 400
    assert api("otto").post("/api/runs/retry", {"ids": []}).status_code == 400
    assert api("rita").post("/api/runs/retry", {"ids": [1]}).status_code == 403
