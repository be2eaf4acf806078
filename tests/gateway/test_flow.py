"""The gateway's "done when": an MCP client of the official SDK connects with a token,
lists the tools, runs a read straight through, gets a destructive call held and, once a
reviewer approves it, its result on the next identical call, the upstream called once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.models import Approval, GatewayStream, Run
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


def test_read_runs_through_and_a_held_delete_returns_its_result_once_approved(
    live_server: Any, gw, upstream, token, rita: User, wait_seconds
) -> None:
    url = f"{live_server.url}/mcp/gw/"

    async def first(client: Any) -> Any:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        read = await client.call_tool("web__lookup", {"record_id": "alpha"})
        held = await client.call_tool("web__delete_record", {"record_id": "beta"})
        return listed, read, held

    listed, read, held = mcp_session(url, token, first)
    assert "web__lookup" in listed and "web__delete_record" in listed and "echo" in listed
    assert "crm_update" not in listed  # a client tool is the decision API's, not the gateway's
    assert listed["web__lookup"].description == "Looks a record up by its id."
    assert listed["web__delete_record"].annotations.destructive_hint is True
    assert not read.is_error and text(read) == "the first record"
    assert not held.is_error
    airlock = held.structured_content["airlock"]
    approval = Approval.objects.get(status="pending")
    assert airlock["status"] == "pending_approval"
    assert airlock["approval_id"] == approval.pk and airlock["run_id"] == approval.run_id
    assert airlock["url"].endswith(f"/reviews/{approval.pk}/")
    assert "same arguments" in text(held)
    assert upstream.calls("delete_record") == []  # held: nothing ran

    approval_decide(approval_id=approval.pk, decision="approve", user=rita, note="fine")

    async def again(client: Any) -> Any:
        return [await client.call_tool("web__delete_record", {"record_id": "beta"}) for _ in range(2)]

    # A new MCP session is the same caller: its stream's run, its held call.
    results = mcp_session(url, token, again)
    assert text(results[0]) == "deleted beta" and not results[0].is_error
    # Delivered once: the same call again is a new intent, policed anew (held, not run).
    assert results[1].structured_content["airlock"]["status"] == "pending_approval"
    assert results[1].structured_content["airlock"]["approval_id"] != approval.pk
    made = upstream.calls("delete_record")
    assert len(made) == 1, made  # the upstream ran it once however often it was asked
    assert made[0]["idempotency_key"]  # with the journal's key in _meta
    run = Run.objects.get(pk=approval.run_id)
    assert run.created_by.username == "lena"  # the token's user launched the run
    assert results[1].structured_content["airlock"]["run_id"] == run.pk
    assert GatewayStream.objects.get(user=run.created_by).run == run


def test_a_client_that_asked_for_progress_hears_while_the_call_waits(
    live_server: Any, gw, upstream, token, settings: Any
) -> None:
    settings.AIRLOCK_GATEWAY_WAIT_SECONDS = 2.5
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        heard.append((done, total, message))

    async def session(client: Any) -> Any:
        return await client.call_tool("web__delete_record", {"record_id": "beta"}, progress_callback=progress)

    held = mcp_session(f"{live_server.url}/mcp/gw/", token, session)
    assert held.structured_content["airlock"]["status"] == "pending_approval"
    assert len(heard) >= 2  # one a second, on the answer's SSE stream through the WSGI bridge
    assert all(total == 2.5 and "reviewer" in (message or "") for _done, total, message in heard)


def test_a_reviewers_edit_is_what_runs_and_the_client_is_told(
    live_server: Any, gw, upstream, token, rita: User, wait_seconds
) -> None:
    url = f"{live_server.url}/mcp/gw/"

    async def held(client: Any) -> Any:
        return await client.call_tool("web__delete_record", {"record_id": "beta"})

    airlock = mcp_session(url, token, held).structured_content["airlock"]
    approval_decide(approval_id=airlock["approval_id"], decision="approve", user=rita,
                    args={"record_id": "gamma"}, note="only the copy")

    async def again(client: Any) -> Any:
        return await client.call_tool("web__delete_record", {"record_id": "beta"})

    result = mcp_session(url, token, again, headers={"Airlock-Run": str(airlock["run_id"])})
    assert not result.is_error and text(result).endswith("deleted gamma")
    assert result.structured_content["airlock"]["edited"] is True
    assert result.structured_content["airlock"]["args"] == {"record_id": "gamma"}
    assert [c["args"] for c in upstream.calls("delete_record")] == [{"record_id": "gamma"}]
