"""Policy through the API: launch tightening, the rule on the approval, grants and revokes."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import AgentProfile, Approval, Grant, LedgerEntry, Run
from agents.runs import driver
from agents.runs.verify import verify_run
from tests.helpers import launch_body, tainted_write

# transaction=True: tools run on a thread with its own connection, which must see the run.
pytestmark = pytest.mark.django_db(transaction=True)

UNDER_20 = {"tool": "ledger_write", "when": {"arg": "entry.amount", "op": "lt", "value": 20}, "then": "allow",
            "reason": "small entries need no human"}
ASK = {"tool": "ledger_write", "then": "ask", "reason": "entries of 20 or more need a human"}


def write(amount: int) -> dict[str, Any]:
    return {"call": {"tool": "ledger_write", "args": {"entry": {"amount": amount}}}}


def profile(**fields: Any) -> None:
    AgentProfile.objects.filter(name="scripted").update(**fields)


def pending(run_id: int) -> Approval:
    return Approval.objects.get(run_id=run_id, status="pending")


@pytest.mark.parametrize(
    "policy, field",
    [
        ({"rules": [{"tool": "echo", "then": "allow", "reason": "r"}]}, "policy.rules[1].then"),
        ({"rules": [{"tool": "echo", "then": "deny"}]}, "policy.rules[1].reason"),
        ({"rules": [{"tool": "echo", "then": "deny", "reason": "r", "when": {"arg": "x", "op": "like"}}]},
         "policy.rules[1].when.op"),
        ({"irreversible_approvals": 1}, "policy.irreversible_approvals"),
        ({"separate_duties": False}, "policy.separate_duties"),
        ({"approval_timeout_seconds": 3600}, "policy.approval_timeout_seconds"),
        ({"on_expiry": "fail"}, "policy.on_expiry"),
        ("strict", "policy"),
    ],
)
def test_a_launch_policy_looser_than_the_profile_is_a_400_naming_the_field(api, policy: Any, field: str) -> None:
    profile(irreversible_approvals=2, separate_duties=True, approval_timeout_seconds=600)
    response = api("lena").post("/api/runs", launch_body(policy=policy))
    assert response.status_code == 400
    assert response.data["error"] == "invalid_policy" and response.data["detail"].startswith(f"{field}: ")
    assert not Run.objects.exists()


def test_a_profile_with_a_broken_rule_launches_nothing(api) -> None:
    profile(rules=[{"tool": "echo", "then": "perhaps", "reason": "r"}])  # saved around clean()
    response = api("lena").post("/api/runs", launch_body())
    # The profile's fault, named as such (#47): not the caller's policy.
    assert response.status_code == 409 and response.data["error"] == "invalid_profile"
    assert "its rules: rules[1].then: " in response.data["detail"]


def test_the_same_tool_is_allowed_under_the_threshold_and_asks_over_it_with_the_rule(api) -> None:
    profile(rules=[UNDER_20, ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(5), write(50), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    run = api("rita").get(f"/api/runs/{run_id}").data
    assert run["state"] == "awaiting_approval"
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 1  # the small one ran without asking
    approval = run["pending_approval"]
    assert approval["args"] == {"entry": {"amount": 50}}
    assert approval["reason"] == "entries of 20 or more need a human"
    assert approval["rule"] == {**ASK, "origin": "profile", "index": 2}
    verdicts = [t["payload"]["verdict"] for t in api("rita").get(f"/api/runs/{run_id}/transitions").data
                if "verdict" in t["payload"]]
    assert [(v["action"], v["rule"]["index"]) for v in verdicts] == [("allow", 1), ("ask", 2)]


def test_a_launch_rule_asks_before_the_profiles_allow(api) -> None:
    profile(rules=[UNDER_20])
    launch_rule = {"tool": "ledger_write", "then": "ask", "reason": "this customer is on watch"}
    run_id = api("lena").post("/api/runs", launch_body([write(5), {"final": "ok"}], policy={"rules": [launch_rule]})).data["id"]
    driver.drive(run_id)
    approval = api("rita").get(f"/api/runs/{run_id}").data["pending_approval"]
    assert approval["reason"] == "this customer is on watch"
    assert approval["rule"] == {**launch_rule, "origin": "launch", "index": 1}


def test_an_ask_rule_without_an_approver_is_a_recorded_denial(api) -> None:
    profile(rules=[ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(50), {"final": "ok"}], approver="none")).data["id"]
    driver.drive(run_id)
    [approval] = api("rita").get("/api/approvals?status=denied").data["items"]
    assert approval["run"] == run_id and approval["rule"]["index"] == 1
    assert approval["reason"] == "entries of 20 or more need a human, and the run has no approver"
    assert Run.objects.get(pk=run_id).state == "done"


def test_a_call_grant_lets_the_identical_call_through_and_a_revoked_grant_asks_again(api) -> None:
    profile(rules=[ASK], limits={"max_identical_calls": 3})
    script = [write(50), write(50), write(50), {"final": "ok"}]
    run_id = api("lena").post("/api/runs", launch_body(script)).data["id"]
    driver.drive(run_id)
    decided = api("rita").post(f"/api/approvals/{pending(run_id).pk}/decision", {"decision": "approve", "remember": "call"})
    assert decided.status_code == 200 and decided.data["status"] == "approved"
    driver.drive(run_id, max_transitions=4)  # run it, propose the same call, run it (the grant), propose the third
    run = api("rita").get(f"/api/runs/{run_id}").data
    [grant] = run["grants"]
    assert (grant["tool"], grant["args"], grant["by"], grant["revoked_at"]) == ("ledger_write", {"entry": {"amount": 50}}, "rita", None)
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 2
    assert run["state"] == "acting"  # the third identical call, let through as well


def test_revoking_a_grant_makes_the_next_call_ask_and_is_on_the_timeline(api) -> None:
    profile(rules=[ASK], limits={"max_identical_calls": 3})
    script = [write(50), write(50), write(50), {"final": "ok"}]
    run_id = api("lena").post("/api/runs", launch_body(script)).data["id"]
    driver.drive(run_id)
    api("rita").post(f"/api/approvals/{pending(run_id).pk}/decision", {"decision": "approve", "remember": "call"})
    driver.drive(run_id, max_transitions=3)  # the approved call, the second (granted), its result
    grant = Grant.objects.get(run_id=run_id)
    assert api("lena").post(f"/api/runs/{run_id}/grants/{grant.pk}/revoke").status_code == 403
    assert api("rita").post(f"/api/runs/{run_id}/grants/{grant.pk + 1}/revoke").status_code == 404
    revoked = api("rob").post(f"/api/runs/{run_id}/grants/{grant.pk}/revoke")
    assert revoked.status_code == 200 and revoked.data["revoked_at"] is not None
    again = api("rita").post(f"/api/runs/{run_id}/grants/{grant.pk}/revoke")
    assert again.status_code == 200 and again.data["revoked_at"] == revoked.data["revoked_at"]
    driver.drive(run_id)
    run = api("rita").get(f"/api/runs/{run_id}").data
    assert run["state"] == "awaiting_approval" and run["pending_approval"]["reason"] == ASK["reason"]
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 2
    kinds = [(t["kind"], t["actor"]) for t in api("rita").get(f"/api/runs/{run_id}/transitions").data]
    assert kinds.count(("revoke", "user:rob")) == 1
    assert verify_run(Run.objects.get(pk=run_id)) == []  # the grant and its revocation replay


def test_a_tool_grant_covers_other_arguments(api) -> None:
    profile(rules=[ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(50), write(70), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    api("rita").post(f"/api/approvals/{pending(run_id).pk}/decision", {"decision": "approve", "remember": "tool"})
    driver.drive(run_id)
    run = api("rita").get(f"/api/runs/{run_id}").data
    assert run["state"] == "done" and run["grants"][0]["args"] is None
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 2


def refused(api, run_id: int, body: dict[str, Any]) -> Any:
    response = api("rita").post(f"/api/approvals/{pending(run_id).pk}/decision", body)
    assert response.status_code == 400, response.data
    assert pending(run_id).status == "pending"  # the refusal consumed nothing
    return response.data


def test_grants_are_refused_for_irreversible_calls(api) -> None:
    profile(tools=None)
    script = [{"call": {"tool": "refund", "args": {"order_id": "1042", "reason": "broken"}}}, {"final": "ok"}]
    run_id = api("lena").post("/api/runs", launch_body(script)).data["id"]
    driver.drive(run_id)
    data = refused(api, run_id, {"decision": "approve", "remember": "tool"})
    assert data == {"error": "grant_refused", "detail": "irreversible calls are approved one at a time"}


def test_grants_are_refused_where_several_votes_are_needed(api) -> None:
    profile(rules=[{**ASK, "approvals": 2}])
    run_id = api("lena").post("/api/runs", launch_body([write(50), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    assert refused(api, run_id, {"decision": "approve", "remember": "call"})["error"] == "grant_refused"


def test_grants_are_refused_for_a_write_the_taint_asked_about(api) -> None:
    run_id = api("lena").post("/api/runs", launch_body(tainted_write())).data["id"]
    driver.drive(run_id)
    data = refused(api, run_id, {"decision": "approve", "remember": "tool"})
    assert data["detail"] == "the run has read external content, so every write asks"


def test_remember_goes_only_with_approve(api) -> None:
    profile(rules=[ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(50), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    assert refused(api, run_id, {"decision": "reject", "remember": "call"})["error"] == "invalid_remember"
    assert refused(api, run_id, {"decision": "approve", "remember": "forever"})["error"] != "grant_refused"


def test_a_finished_runs_grants_cannot_be_revoked(api) -> None:
    profile(rules=[ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(50), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    api("rita").post(f"/api/approvals/{pending(run_id).pk}/decision", {"decision": "approve", "remember": "tool"})
    driver.drive(run_id)
    grant = Grant.objects.get(run_id=run_id)
    response = api("rita").post(f"/api/runs/{run_id}/grants/{grant.pk}/revoke")
    assert response.status_code == 409 and response.data["error"] == "not_active"
