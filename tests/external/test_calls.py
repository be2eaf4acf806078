"""The decision API's answers beyond "allowed": held, rejected, denied, expired, the
long poll, reports out of turn, usage and cost, and profiles that cannot launch."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from agents.actions import external
from agents.actions.approvals import approval_expire
from agents.models import AgentProfile, Approval, Run
from tests.helpers import CRM_UPDATE, requires_postgres

pytestmark = pytest.mark.django_db

ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}
NO_FAILS = {"tool": "fail", "then": "deny", "reason": "nobody calls fail"}


def propose(api, run_id: int, tool: str, **args: Any) -> Any:
    return api("lena").post(f"/api/runs/{run_id}/calls", {"tool": tool, "args": args})


def test_a_rejected_call_says_so_with_the_reviewers_note(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM]})
    held = propose(api, run_id, "crm_update", customer="A", note="n").data
    response = api("rita").post(f"/api/approvals/{held['approval']['id']}/decision",
                                {"decision": "reject", "note": "not this customer"})
    assert response.status_code == 200
    told = api("lena").get(f"/api/runs/{run_id}/calls/{held['key']}?wait=5").data
    assert (told["status"], told["note"]) == ("rejected", "not this customer")
    report = api("lena").post(f"/api/runs/{run_id}/calls/{held['key']}/result", {"ok": True, "output": "did it anyway"})
    assert report.status_code == 409 and report.data["error"] == "not_approved"
    assert Run.objects.get(pk=run_id).state == "planning"


def test_a_denied_call_is_denied_again_when_retried_and_never_recorded_as_run(api, external_run) -> None:
    run_id = external_run(policy={"rules": [NO_FAILS]})
    first = propose(api, run_id, "fail").data
    assert (first["verdict"], first["status"], first["reason"]) == ("deny", "denied", "nobody calls fail")
    assert first["rule"]["reason"] == "nobody calls fail"
    again = propose(api, run_id, "fail").data
    assert (again["key"], again["status"]) == (first["key"], "denied")
    run = Run.objects.get(pk=run_id)
    assert run.transitions.filter(kind="model").count() == 1 and not run.tool_calls.exists()


def test_an_approval_nobody_answers_expires_and_the_client_is_told(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM], "approval_timeout_seconds": 60})
    held = propose(api, run_id, "crm_update", customer="A", note="n").data
    assert approval_expire(approval_id=held["approval"]["id"], owner="test", now=time.time() + 120)
    told = api("lena").get(f"/api/runs/{run_id}/calls/{held['key']}").data
    assert told["status"] == "expired" and told["approval"]["status"] == "expired"
    assert propose(api, run_id, "echo", text="next").data["status"] == "succeeded"


def test_a_report_before_the_approval_is_refused(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM]})
    held = propose(api, run_id, "crm_update", customer="A", note="n").data
    response = api("lena").post(f"/api/runs/{run_id}/calls/{held['key']}/result", {"ok": True, "output": "x"})
    assert response.status_code == 409 and response.data["error"] == "not_approved"
    assert response.data["detail"]["status"] == "pending"
    ran = propose(api, run_id, "echo", text="x")
    assert ran.status_code == 409 and ran.data["error"] == "call_pending"
    assert ran.data["detail"]["call"]["approval"]["id"] == held["approval"]["id"]
    finish = api("lena").post(f"/api/runs/{run_id}/finish", {"answer": "early"})
    assert finish.status_code == 409 and finish.data["error"] == "call_pending"


def test_a_registry_tools_result_cannot_be_reported_by_the_client(api, external_run) -> None:
    run_id = external_run()
    ran = propose(api, run_id, "echo", text="real").data
    response = api("lena").post(f"/api/runs/{run_id}/calls/{ran['key']}/result", {"ok": True, "output": "fake"})
    assert response.status_code == 409 and response.data["error"] == "not_a_client_tool"
    assert api("lena").get(f"/api/runs/{run_id}/calls/{ran['key']}").data["result"] == {"ok": True, "result": "real"}


def test_unknown_keys_bad_waits_and_bad_usage_are_4xx(api, external_run) -> None:
    run_id = external_run()
    lena = api("lena")
    assert lena.get(f"/api/runs/{run_id}/calls/{'0' * 64}").status_code == 404
    assert lena.get(f"/api/runs/{run_id}/calls/{'0' * 64}?wait=31").status_code == 400
    bad = lena.post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "x"}, "usage": {"input_tokens": -1}})
    assert bad.status_code == 400 and bad.data["error"] == "invalid_usage"
    assert lena.post(f"/api/runs/{run_id}/calls", {"tool": "echo", "argz": {}}).status_code == 400
    assert Run.objects.get(pk=run_id).steps == 0


def test_usage_feeds_tokens_and_cost_and_a_call_without_it_marks_cost_unknown(api, external_run, profile) -> None:
    AgentProfile.objects.filter(pk=profile.pk).update(price_input_micros=2_000_000, price_output_micros=10_000_000)
    run_id = external_run(limits={"max_tokens": 1001})
    body = {"tool": "echo", "args": {"text": "x"}, "usage": {"input_tokens": 900, "output_tokens": 100}}
    assert api("lena").post(f"/api/runs/{run_id}/calls", body).data["status"] == "succeeded"
    run = Run.objects.get(pk=run_id)
    assert (run.tokens, run.cost_micros, run.cost_unknown) == (1000, 2800, False)
    over = api("lena").post(f"/api/runs/{run_id}/calls", {**body, "args": {"text": "y"}})
    # The engine checks budgets before every step: the call is taken, its tool never runs.
    assert (over.data["status"], over.data["run_state"]) == ("expired", "failed")
    assert "max_tokens 1001" in Run.objects.get(pk=run_id).error

    other = external_run()
    propose(api, other, "echo", text="no usage")
    assert Run.objects.get(pk=other).cost_unknown is True


@requires_postgres()  # Django never closes an in-memory SQLite database's connection
@pytest.mark.django_db(transaction=True)  # the waiter polls from its own thread and connection
def test_a_long_poll_returns_the_decision_and_holds_no_connection_while_it_waits(
    api, users, external_run, monkeypatch
) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM]})
    held = propose(api, run_id, "crm_update", customer="A", note="n").data
    waiting = threading.Event()
    connected_while_asleep: list[bool] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        connected_while_asleep.append(connection.connection is not None)
        waiting.set()
        real_sleep(seconds)

    monkeypatch.setattr(external.time, "sleep", sleep)
    answers: list[Any] = []

    def wait() -> None:
        try:
            answers.append(external.call_wait(run_id=run_id, key=held["key"], user=users["lena"], wait=20))
        finally:
            connection.close()

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert waiting.wait(10), "the long poll did not wait"
    api("rita").post(f"/api/approvals/{held['approval']['id']}/decision", {"decision": "approve"})
    waiter.join(25)
    assert not waiter.is_alive()
    assert answers[0].status == "approved"
    assert connected_while_asleep and not any(connected_while_asleep)


def test_client_tools_are_checked_when_a_profile_is_saved(defaults) -> None:
    with pytest.raises(ValidationError, match=r"client_tools\[0\] lacks description"):
        AgentProfile.objects.create(name="bad", provider="external", client_tools=[{"name": "x"}])
    tool = {"name": "x", "description": "", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}},
            "risk": "read", "returns": "internal", "retry_safety": "safe"}
    with pytest.raises(ValidationError, match=r"client_tools\[0\]\.schema is refused"):
        AgentProfile.objects.create(name="bad", provider="external", client_tools=[tool])
    with pytest.raises(ValidationError, match="only an external profile has client tools"):
        AgentProfile.objects.create(name="bad", provider="openai", client_tools=[{**tool, "schema": {"type": "object"}}])
    assert not AgentProfile.objects.filter(name="bad").exists()


def test_a_client_tool_named_like_a_registered_tool_cannot_launch(api, defaults) -> None:
    tool = {"name": "echo", "description": "mine", "schema": {"type": "object"}, "risk": "read",
            "returns": "internal", "retry_safety": "safe"}
    AgentProfile.objects.create(name="clash", provider="external", client_tools=[tool])
    response = api("lena").post("/api/runs", {"agent": "clash", "task": "t"})
    assert response.status_code == 409 and response.data["error"] == "invalid_profile"
    assert "echo" in response.data["detail"] and not Approval.objects.exists()


def test_a_model_driven_run_takes_no_proposals_and_a_finished_run_no_second_answer(api, launch, users, external_run) -> None:
    scripted = launch([{"final": "hi"}], user=users["lena"])
    response = propose(api, scripted.pk, "echo", text="x")
    assert response.status_code == 409 and response.data["error"] == "not_external"
    run_id = external_run()
    assert api("lena").post(f"/api/runs/{run_id}/finish", {"answer": "done"}).data["state"] == "done"
    again = api("lena").post(f"/api/runs/{run_id}/finish", {"answer": "done"})
    assert again.status_code == 200 and again.data["answer"] == "done"
    other = api("lena").post(f"/api/runs/{run_id}/finish", {"answer": "something else"})
    assert other.status_code == 409 and other.data["error"] == "run_ended"
    assert Run.objects.get(pk=run_id).transitions.filter(to_state="done").count() == 1


def test_a_profile_offering_every_tool_offers_its_client_tools_and_asks_as_told(api, defaults) -> None:
    AgentProfile.objects.create(name="open", provider="external", client_tools=[CRM_UPDATE], tools=None,
                                always_ask_tools=["crm_update"])
    run_id = api("lena").post("/api/runs", {"agent": "open", "task": "t"}).data["id"]
    assert propose(api, run_id, "echo", text="x").data["status"] == "succeeded"
    held = propose(api, run_id, "crm_update", customer="A", note="n").data
    assert (held["verdict"], held["status"], held["client_tool"]) == ("ask", "pending", True)


def test_votes_separated_duties_and_outbox_events_hold_for_an_external_call(api, external_run) -> None:
    from agents.models import OutboxEvent

    two = {**ASK_CRM, "approvals": 2, "reason": "two people read CRM notes"}
    # root may both drive and decide; on its own run the policy keeps it from approving.
    run_id = external_run("root", policy={"rules": [two]})
    root = api("root")
    held = root.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "A", "note": "n"}}).data
    url = f"/api/approvals/{held['approval']['id']}/decision"
    own = root.post(url, {"decision": "approve"})
    assert own.status_code == 403 and own.data["error"] == "separation_of_duties"
    assert api("rita").post(url, {"decision": "approve"}).status_code == 200
    assert root.get(f"/api/runs/{run_id}/calls/{held['key']}").data["status"] == "pending"
    assert api("rob").post(url, {"decision": "approve"}).status_code == 200
    told = root.get(f"/api/runs/{run_id}/calls/{held['key']}").data
    assert told["status"] == "approved" and [v["by"] for v in told["approval"]["votes"]] == ["rita", "rob"]
    events = list(OutboxEvent.objects.filter(run_id=run_id).order_by("pk").values_list("type", flat=True))
    assert events == ["approval.pending", "approval.decided"]
