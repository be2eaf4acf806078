"""The Python client (`clients/python`, import `airlock_client`) against the real API on
the threaded live server: each method is the endpoint it names, and each way a call can
end without running is its own exception."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from agents.actions.approvals import approval_decide
from agents.actions.tokens import token_create
from agents.models import Approval, LedgerEntry, Run, ToolCall

# The client is its own distribution (no Django); `make install` installs it editable,
# and a bare checkout finds it here.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))

from airlock_client import Airlock, Denied, Expired, Refused, Rejected, StillPending  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}
CALL = {"customer": "ACME", "note": "called"}


@pytest.fixture
def airlock(live_server: Any, profile: Any, users: dict[str, User]) -> Any:
    """An Airlock client holding a token of lena's (a launcher); rita reviews."""
    _token, raw = token_create(user=users["lena"])
    with Airlock(live_server.url, raw) as client:
        yield client


def decide_soon(approval_id: int, decision: str, **extra: Any) -> threading.Thread:
    """A reviewer (rita) decides from another thread while the client waits."""

    def _decide() -> None:
        try:
            approval_decide(approval_id=approval_id, user=User.objects.get(username="rita"), decision=decision, **extra)
        finally:
            connection.close()

    thread = threading.Thread(target=_decide)
    thread.start()
    return thread


def test_a_client_tool_allowed_by_policy_runs_in_the_client_and_is_journalled(airlock: Any) -> None:
    run = airlock.start_run("ext", "tidy the CRM")
    assert run.state in ("queued", "planning") and run.agent == "ext"
    ran: list[dict[str, Any]] = []

    def crm_update(customer: str, note: str) -> dict[str, int]:
        ran.append({"customer": customer, "note": note})
        return {"updated": 1}

    assert airlock.call(run, "crm_update", CALL, crm_update) == {"updated": 1}
    assert ran == [CALL]
    done = airlock.finish(run, "CRM tidied", usage={"input_tokens": 10, "output_tokens": 2})
    assert (done.state, done.data["answer"], done.data["tokens"]) == ("done", "CRM tidied", 12)
    call = ToolCall.objects.get(run_id=run.id)
    assert (call.tool, call.status) == ("crm_update", "succeeded")


def test_an_airlock_tool_runs_on_the_server_and_its_result_comes_back(airlock: Any) -> None:
    run = airlock.start_run("ext", "write it down")
    decision = airlock.decide(run, "ledger_write", {"entry": "one"})
    assert (decision.status, decision.client_tool) == ("succeeded", False)
    assert decision.result["ok"] is True
    # An identical call is the same call: its result, never a second run.
    again = airlock.decide(run, "ledger_write", {"entry": "one"})
    assert again.key == decision.key and LedgerEntry.objects.filter(run_id=run.id).count() == 1


def test_a_held_call_waits_for_the_reviewer_and_runs_with_the_edited_arguments(airlock: Any) -> None:
    run = airlock.start_run("ext", "tidy the CRM", policy={"rules": [ASK_CRM]})
    held = airlock.propose(run, "crm_update", CALL)
    assert (held.verdict, held.status) == ("ask", "pending") and held.approval_id is not None
    assert Approval.objects.get(pk=held.approval_id).status == "pending"
    reviewer = decide_soon(held.approval_id, "approve", args={"customer": "ACME", "note": "called twice"})
    decision = airlock.wait(run, held.key, timeout=20)
    reviewer.join(10)
    assert (decision.status, decision.edited) == ("approved", True)
    assert decision.args == {"customer": "ACME", "note": "called twice"}
    reported = airlock.report(run, decision.key, ok=True, output={"updated": 1})
    assert reported.status == "succeeded"
    # A second report changes nothing.
    assert airlock.report(run, decision.key, ok=False, output="no").result == {"ok": True, "result": {"updated": 1}}


def test_a_rejection_is_an_exception_carrying_the_reviewers_note(airlock: Any) -> None:
    run = airlock.start_run("ext", "tidy the CRM", policy={"rules": [ASK_CRM]})
    held = airlock.propose(run, "crm_update", CALL)
    decide_soon(held.approval_id, "reject", note="not this customer").join(10)
    with pytest.raises(Rejected, match="not this customer") as caught:
        airlock.decide(run, "crm_update", CALL, timeout=5)
    assert caught.value.decision.key == held.key and caught.value.decision.note == "not this customer"
    assert not ToolCall.objects.filter(run_id=run.id, status="succeeded").exists()


def test_a_policy_denial_is_an_exception_naming_the_reason(airlock: Any) -> None:
    deny = {"tool": "crm_update", "then": "deny", "reason": "no CRM writes today"}
    run = airlock.start_run("ext", "tidy the CRM", policy={"rules": [deny]})
    with pytest.raises(Denied, match="no CRM writes today"):
        airlock.call(run, "crm_update", CALL, lambda **_: pytest.fail("a denied call ran"))


def test_an_expired_approval_is_an_exception_of_its_own(airlock: Any) -> None:
    from agents.actions.approvals import approval_expire

    run = airlock.start_run("ext", "tidy the CRM", policy={"rules": [ASK_CRM], "approval_timeout_seconds": 60})
    held = airlock.propose(run, "crm_update", CALL)
    approval = Approval.objects.get(pk=held.approval_id)
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=approval.expires_at.timestamp() + 1)
    with pytest.raises(Expired):
        airlock.decide(run, "crm_update", CALL, timeout=5)


def test_wait_gives_up_after_its_timeout_with_the_call_still_pending(airlock: Any) -> None:
    run = airlock.start_run("ext", "tidy the CRM", policy={"rules": [ASK_CRM]})
    held = airlock.propose(run, "crm_update", CALL)
    with pytest.raises(StillPending) as caught:
        airlock.wait(run, held.key, timeout=0)
    assert caught.value.decision.status == "pending"


def test_refusals_carry_the_apis_code_and_detail(airlock: Any, live_server: Any) -> None:
    run = airlock.start_run("ext", "tidy the CRM")
    with pytest.raises(Refused) as bad_args:
        airlock.propose(run, "crm_update", {"customer": 7})
    assert (bad_args.value.status, bad_args.value.code) == (400, "invalid_arguments")
    with pytest.raises(Refused) as unknown:
        airlock.propose(run, "rm_rf", {})
    assert unknown.value.code == "unknown_tool"
    with pytest.raises(Refused) as no_token:
        Airlock(live_server.url, "not-a-token").start_run("ext", "x")
    assert no_token.value.status == 401
    assert Run.objects.get(pk=run.id).state == "planning"


def test_an_airlock_that_cannot_be_reached_is_unavailable_not_a_refusal() -> None:
    import socket

    from airlock_client import Unavailable

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Airlock(f"http://127.0.0.1:{port}", "any-token", timeout=2) as client, pytest.raises(Unavailable):
        client.start_run("ext", "x")
