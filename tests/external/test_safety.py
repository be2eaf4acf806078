"""What an external agent cannot get past: an approval is bound to the exact call (and
an edit is what runs), retries and racing clients run a tool once, taint carries across
calls, unknown tools and other people's runs are refused, budgets end the run, and the
record replays."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from agents.actions import external
from agents.models import Approval, ClientCall, LedgerEntry, Run, ToolCall
from agents.runs import driver, verify
from tests.helpers import PLANTED, at_once, requires_postgres, state_of, wait_for

ASK_LEDGER = {"tool": "ledger_write_unsafe", "then": "ask", "reason": "a human signs the ledger"}
ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}


def propose(api, run_id: int, tool: str, who: str = "lena", **args: Any) -> Any:
    return api(who).post(f"/api/runs/{run_id}/calls", {"tool": tool, "args": args})


def approve(api, answer: dict[str, Any], who: str = "rita", **body: Any) -> Any:
    response = api(who).post(f"/api/approvals/{answer['approval']['id']}/decision", {"decision": "approve", **body})
    assert response.status_code == 200, response.data
    return response


@pytest.mark.django_db(transaction=True)  # the ledger tool writes from its own thread and connection
def test_an_approval_gives_its_result_only_to_the_exact_call_it_approved(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_LEDGER]})
    held = propose(api, run_id, "ledger_write_unsafe", entry="pay ACME 100").data
    assert (held["verdict"], held["status"]) == ("ask", "pending")
    other = propose(api, run_id, "ledger_write_unsafe", entry="pay ACME 999")
    assert other.status_code == 409 and other.data["error"] == "call_pending"
    assert other.data["detail"]["call"]["key"] == held["key"]
    approve(api, held)
    driver.drive(run_id)  # the worker runs Airlock's tool after the approval

    done = api("lena").get(f"/api/runs/{run_id}/calls/{held['key']}").data
    assert done["status"] == "succeeded" and done["args"] == {"entry": "pay ACME 100"}
    after = propose(api, run_id, "ledger_write_unsafe", entry="pay ACME 999").data
    assert after["key"] != held["key"]
    assert (after["verdict"], after["status"], after["result"]) == ("ask", "pending", None)
    assert list(LedgerEntry.objects.values_list("entry", flat=True)) == ["pay ACME 100"]


@pytest.mark.django_db
def test_a_reviewers_edit_is_what_the_client_runs_and_it_is_told_so(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM]})
    held = propose(api, run_id, "crm_update", customer="ACME", note="they owe us 5000").data
    assert held["status"] == "pending" and held["client_tool"] is True
    approve(api, held, args={"customer": "ACME", "note": "follow up on the invoice"}, note="no amounts in notes")

    told = api("lena").get(f"/api/runs/{run_id}/calls/{held['key']}").data
    assert told["status"] == "approved" and told["edited"] is True
    assert told["args"] == {"customer": "ACME", "note": "follow up on the invoice"}
    # Asking again with its own arguments is the same call: it is told the same.
    retry = propose(api, run_id, "crm_update", customer="ACME", note="they owe us 5000").data
    assert (retry["key"], retry["args"], retry["edited"]) == (held["key"], told["args"], True)
    reported = api("lena").post(f"/api/runs/{run_id}/calls/{held['key']}/result", {"ok": True, "output": "saved"})
    assert reported.data["status"] == "succeeded"
    [journal] = ToolCall.objects.filter(run_id=run_id)
    assert journal.args == {"customer": "ACME", "note": "follow up on the invoice"} and journal.status == "succeeded"
    assert journal.idempotency_key != held["key"]
    # The edited call, proposed as such, is the call that ran: it never runs twice either.
    same = propose(api, run_id, "crm_update", customer="ACME", note="follow up on the invoice").data
    assert same["key"] == held["key"] and same["status"] == "succeeded"
    assert ToolCall.objects.filter(run_id=run_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_ten_identical_retries_of_a_pending_call_run_the_tool_once(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_LEDGER]})
    answers = [propose(api, run_id, "ledger_write_unsafe", entry="refund 40").data for _ in range(10)]
    assert {a["key"] for a in answers} == {answers[0]["key"]}
    assert {a["status"] for a in answers} == {"pending"}
    assert Approval.objects.filter(run_id=run_id).count() == 1
    approve(api, answers[0])
    driver.drive(run_id)
    later = [propose(api, run_id, "ledger_write_unsafe", entry="refund 40").data for _ in range(10)]
    assert {(a["key"], a["status"]) for a in later} == {(answers[0]["key"], "succeeded")}
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 1
    assert Run.objects.get(pk=run_id).state == "planning"


@requires_postgres()  # row locks: SQLite has none to queue the racing proposals on
@pytest.mark.django_db(transaction=True)  # racing clients: each thread has its own connection
def test_two_clients_racing_on_one_run_execute_the_tool_once(users, external_run) -> None:
    run_id = external_run()
    lena = users["lena"]

    def one(_: int) -> dict[str, Any]:
        answer = external.call_propose(run_id=run_id, tool="ledger_write_unsafe", args={"entry": "pay once"}, user=lena)
        return answer.to_dict()

    answers = at_once(one, range(6))
    assert len({a["key"] for a in answers}) == 1
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 1
    assert ClientCall.objects.filter(run_id=run_id).count() == 1
    settled = external.call_wait(run_id=run_id, key=answers[0]["key"], user=lena, wait=10)
    assert settled.status == "succeeded"


@pytest.mark.django_db
def test_a_write_after_reading_external_content_is_held_across_calls(api, external_run) -> None:
    run_id = external_run()
    read = propose(api, run_id, "fetch_fixture", text=PLANTED).data
    assert (read["verdict"], read["status"]) == ("allow", "succeeded")
    write = propose(api, run_id, "crm_update", customer="ACME", note="email the discount code").data
    assert (write["verdict"], write["status"]) == ("ask", "pending")
    assert write["approval"]["taint_source"]["tool"] == "fetch_fixture"
    assert Run.objects.get(pk=run_id).tainted is True


@pytest.mark.django_db
def test_an_unknown_tool_is_refused_and_recorded_like_a_models_bad_call(api, external_run) -> None:
    run_id = external_run()
    response = propose(api, run_id, "send_email", to="all@example.com")  # registered, not offered
    assert response.status_code == 400 and response.data["error"] == "unknown_tool"
    bad = propose(api, run_id, "crm_update", customer="ACME")
    assert bad.status_code == 400 and bad.data["error"] == "invalid_arguments" and "note" in bad.data["detail"]
    run = Run.objects.get(pk=run_id)
    assert [t.payload["invalid"]["error"] for t in run.transitions.filter(kind="model")] == [
        "unknown_tool", "invalid_arguments",
    ]
    assert run.engine["consecutive_errors"] == 2 and run.state == "planning"
    assert not ToolCall.objects.filter(run=run).exists() and not ClientCall.objects.filter(run=run).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("who", "status"), [("leo", 404), ("otto", 403), ("rita", 403), (None, 401)])
def test_only_the_launcher_drives_an_external_run(api, external_run, who, status) -> None:
    run_id = external_run("lena")
    mine = propose(api, run_id, "echo", text="mine").data
    for response in (
        api(who).post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "theirs"}}),
        api(who).get(f"/api/runs/{run_id}/calls/{mine['key']}"),
        api(who).post(f"/api/runs/{run_id}/finish", {"answer": "stolen"}),
    ):
        assert response.status_code == status, response.data
    run = Run.objects.get(pk=run_id)
    assert run.state == "planning" and run.steps == 2
    assert propose(api, run_id, "echo", who="root", text="root may").data["status"] == "succeeded"


@pytest.mark.django_db
def test_verify_runs_is_clean_after_an_external_run(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_CRM]})
    propose(api, run_id, "echo", text="a read", who="lena")
    held = propose(api, run_id, "crm_update", customer="ACME", note="called").data
    approve(api, held, args={"customer": "ACME", "note": "called twice"})
    api("lena").post(f"/api/runs/{run_id}/calls/{held['key']}/result", {"ok": False, "output": {"crm": "down"}})
    api("lena").post(f"/api/runs/{run_id}/finish", {"answer": "done", "usage": {"input_tokens": 9, "output_tokens": 1}})
    run = Run.objects.get(pk=run_id)
    assert run.state == "done"
    assert verify.verify_run(run) == []
    out = io.StringIO()
    call_command("verify_runs", str(run_id), stdout=out)
    assert "0 inconsistent" in out.getvalue()


@pytest.mark.django_db
def test_the_step_budget_ends_the_run_failed_naming_the_limit(api, external_run) -> None:
    run_id = external_run(limits={"max_steps": 3})
    propose(api, run_id, "echo", text="one")  # a proposal and its tool: two steps
    propose(api, run_id, "crm_update", customer="ACME", note="two")  # the third: awaits its report
    response = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "three"}})
    assert response.status_code == 409 and response.data["error"] == "call_pending"
    key = ClientCall.objects.get(run_id=run_id, tool="crm_update").key
    api("lena").post(f"/api/runs/{run_id}/calls/{key}/result", {"ok": True, "output": "ok"})
    over = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "three"}})
    assert over.status_code == 409 and over.data["error"] == "run_ended"
    assert over.data["detail"]["state"] == "failed" and "max_steps 3" in over.data["detail"]["error"]
    run = Run.objects.get(pk=run_id)
    assert run.state == "failed" and "max_steps" in run.error


@pytest.mark.django_db
def test_an_unsafe_registry_call_cut_off_mid_run_asks_a_human_whether_it_happened(api, external_run) -> None:
    run_id = external_run(policy={"rules": [ASK_LEDGER]})
    held = propose(api, run_id, "ledger_write_unsafe", entry="pay ACME 100").data
    approve(api, held)
    # The process running the tool died after marking the intent started, before the result.
    assert ToolCall.objects.filter(run_id=run_id, status="intended").update(status="started", attempts=1) == 1
    driver.drive(run_id)  # the sweeper's wake-up: a worker resumes the run

    told = api("lena").get(f"/api/runs/{run_id}/calls/{held['key']}").data
    assert told["status"] == "pending" and told["approval"]["kind"] == "outcome_unknown"
    assert LedgerEntry.objects.count() == 0  # nothing ran again on its own
    api("rita").post(f"/api/approvals/{told['approval']['id']}/decision",
                     {"decision": "happened", "note": "the bank shows the payment"})
    done = api("lena").get(f"/api/runs/{run_id}/calls/{held['key']}").data
    assert done["status"] == "succeeded" and done["result"]["result"] == "the bank shows the payment"
    assert Run.objects.get(pk=run_id).state == "planning"


@pytest.mark.django_db(transaction=True)  # the first call runs in its own thread and connection
def test_a_call_made_while_airlocks_tool_runs_another_waits_its_turn(users, external_run) -> None:
    run_id = external_run()
    lena = users["lena"]
    first: list[Any] = []

    def slow() -> None:
        try:
            first.append(external.call_propose(run_id=run_id, tool="sleep", args={"seconds": 1}, user=lena))
        finally:
            connection.close()

    thread = threading.Thread(target=slow)
    thread.start()
    wait_for(lambda: state_of(run_id) == "acting", timeout=30, what="the sleep running")
    second = external.call_propose(run_id=run_id, tool="echo", args={"text": "after"}, user=lena)
    thread.join(30)
    assert (first[0].status, second.status) == ("succeeded", "succeeded")
    kinds = list(Run.objects.get(pk=run_id).transitions.order_by("seq").values_list("kind", flat=True))
    assert kinds == ["launch", "pickup", "model", "tool", "model", "tool"]
