"""A held call as a task (docs/gateway.md, "Tasks"): a 2026-07-28 client that declares
the tasks extension gets a task handle for a call that waits for a human, polls it to
the call's outcome, and may withdraw it; a task is its caller's alone."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.actions.tokens import token_create
from agents.models import Approval, GatewayTask, Run, Transition
from tests.gateway.conftest import modern_rpc
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]
DELETE = {"name": "web__delete_record", "arguments": {"record_id": "delta"}}


def text(result: dict[str, Any]) -> str:
    return "\n".join(b["text"] for b in result["content"] if b.get("type") == "text")


@pytest.fixture
def url(live_server: Any, gw, wait_seconds) -> str:
    return f"{live_server.url}/mcp/gw/"


def test_the_server_says_it_takes_tasks(url: str, token: str) -> None:
    found = modern_rpc(url, token, "server/discover", {})["result"]
    assert "io.modelcontextprotocol/tasks" in found["capabilities"]["extensions"]


def test_a_held_call_is_a_task_polled_to_its_result_after_one_approval(
    url: str, upstream, token: str, rita: User
) -> None:
    handle = modern_rpc(url, token, "tools/call", DELETE)["result"]
    assert (handle["resultType"], handle["status"]) == ("task", "working")
    assert "holding this call for a human reviewer" in handle["statusMessage"]
    task_id = handle["taskId"]
    # The same call again (another connection, the same caller) is the same task and approval.
    assert modern_rpc(url, token, "tools/call", DELETE)["result"]["taskId"] == task_id
    approval = Approval.objects.get()
    polled = modern_rpc(url, token, "tasks/get", {"taskId": task_id})["result"]
    assert (polled["resultType"], polled["status"], polled["taskId"]) == ("complete", "working", task_id)
    assert "result" not in polled and upstream.calls("delete_record") == []
    approval_decide(approval_id=approval.pk, decision="approve", user=rita)
    done = modern_rpc(url, token, "tasks/get", {"taskId": task_id})["result"]
    assert done["status"] == "completed" and done["result"]["isError"] is False
    assert text(done["result"]) == "deleted delta"
    # Polled again, the outcome stays; the upstream ran once.
    assert modern_rpc(url, token, "tasks/get", {"taskId": task_id})["result"]["result"] == done["result"]
    assert len(upstream.calls("delete_record")) == 1
    assert Approval.objects.count() == 1 and GatewayTask.objects.count() == 1


def test_a_rejected_call_completes_as_an_error_with_the_reviewers_note(
    url: str, upstream, token: str, rita: User
) -> None:
    task_id = modern_rpc(url, token, "tools/call", DELETE)["result"]["taskId"]
    approval_decide(approval_id=Approval.objects.get().pk, decision="reject", user=rita, note="not delta, ever")
    done = modern_rpc(url, token, "tasks/get", {"taskId": task_id})["result"]
    assert done["status"] == "completed" and done["result"]["isError"] is True
    assert "Reviewer's note: not delta, ever" in text(done["result"])
    assert done["result"]["structuredContent"]["airlock"]["status"] == "rejected"
    assert upstream.calls("delete_record") == []


def test_cancelling_a_held_task_withdraws_the_call_and_the_stream_goes_on(
    url: str, upstream, token: str, rita: User
) -> None:
    task_id = modern_rpc(url, token, "tools/call", DELETE)["result"]["taskId"]
    run = Run.objects.get()
    acked = modern_rpc(url, token, "tasks/cancel", {"taskId": task_id})["result"]
    assert acked["resultType"] == "complete" and set(acked) <= {"resultType", "_meta"}  # an empty acknowledgement
    polled = modern_rpc(url, token, "tasks/get", {"taskId": task_id})["result"]
    assert polled["status"] == "cancelled" and "result" not in polled
    run.refresh_from_db()
    assert run.state == "cancelled"
    said = Transition.objects.filter(run=run, to_state="cancelled").get()
    assert "withdrew its held call web__delete_record (tasks/cancel)" in str(said.payload)
    assert Approval.objects.get().status != "pending"
    # Nothing of it runs, and the caller's next call goes on in a run that continues it.
    later = modern_rpc(url, token, "tools/call", {"name": "web__delete_record", "arguments": {"record_id": "eps"}})
    assert later["result"]["resultType"] == "task"
    assert Run.objects.get(continues=run).state == "awaiting_approval"
    assert upstream.calls("delete_record") == []


def test_cancelling_an_approved_task_lets_it_finish(url: str, upstream, token: str, rita: User) -> None:
    task_id = modern_rpc(url, token, "tools/call", DELETE)["result"]["taskId"]
    approval_decide(approval_id=Approval.objects.get().pk, decision="approve", user=rita)
    assert "error" not in modern_rpc(url, token, "tasks/cancel", {"taskId": task_id})
    done = modern_rpc(url, token, "tasks/get", {"taskId": task_id})["result"]
    assert done["status"] == "completed" and text(done["result"]) == "deleted delta"


def test_a_task_is_its_callers_alone(url: str, upstream, token: str, leo: User) -> None:
    task_id = modern_rpc(url, token, "tools/call", DELETE)["result"]["taskId"]
    _t, leos = token_create(user=leo)
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        error = modern_rpc(url, leos, method, {"taskId": task_id, "inputResponses": {}})["error"]
        assert error["message"] == f"Unknown task {task_id!r}"
    assert modern_rpc(url, token, "tasks/get", {"taskId": "forged"})["error"]["data"] == {"reason": "unknown_task"}
    # The routing header names the task the body does (a balancer may have routed by it).
    mismatched = modern_rpc(url, token, "tasks/get", {"taskId": task_id}, name="another-task")["error"]
    assert mismatched["code"] == -32020
    assert Run.objects.get().state == "awaiting_approval" and Approval.objects.get().status == "pending"


def test_a_client_that_did_not_declare_tasks_never_gets_one(url: str, upstream, token: str) -> None:
    held = modern_rpc(url, token, "tools/call", DELETE, tasks=False)["result"]
    assert held["resultType"] == "complete" and held["structuredContent"]["airlock"]["status"] == "pending_approval"
    assert not GatewayTask.objects.exists()
    # Nor may it use the tasks/* methods: each request declares the extension.
    task_id = modern_rpc(url, token, "tools/call", DELETE)["result"]["taskId"]
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        error = modern_rpc(url, token, method, {"taskId": task_id, "inputResponses": {}}, tasks=False)["error"]
        assert error["code"] == -32021
        assert error["data"] == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    assert Run.objects.get().state == "awaiting_approval"


def test_an_allowed_call_answers_at_once_even_to_a_task_client(url: str, upstream, token: str) -> None:
    found = modern_rpc(url, token, "tools/call", {"name": "web__lookup", "arguments": {"record_id": "alpha"}})["result"]
    assert found["resultType"] == "complete" and not GatewayTask.objects.exists()


def test_the_handshake_era_offers_no_tasks(url: str, upstream, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    opened = httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}})
    assert opened.json()["result"]["protocolVersion"] == "2025-11-25"
    headers |= {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    asked = httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get",
                                                   "params": {"taskId": "any"}})
    assert asked.json()["error"]["code"] == -32601
