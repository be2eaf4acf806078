"""What the gateway must never do: run a retried call twice, let read content go
unnoticed before a write, reach a tool (or an upstream) its profile does not offer,
show the upstream's secrets, or answer a refusal with a protocol error."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.gateway import core
from agents.models import AgentProfile, Approval, ClientCall, Run
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]
DELETE = ("web__delete_record", {"record_id": "beta"})


def test_ten_identical_retries_of_a_held_call_run_the_upstream_once(
    live_server: Any, gw, upstream, token, rita: User, wait_seconds, settings
) -> None:
    url = f"{live_server.url}/mcp/gw/"

    async def held(client: Any) -> Any:
        first = await client.call_tool(*DELETE)
        retries = [await client.call_tool(*DELETE) for _ in range(3)]
        return first, retries

    first, retries = mcp_session(url, token, held)
    run_id = first.structured_content["airlock"]["run_id"]
    assert all(r.structured_content["airlock"]["status"] == "pending_approval" for r in retries)
    approval_decide(approval_id=first.structured_content["airlock"]["approval_id"], decision="approve", user=rita)
    # The racing calls wait for the one that runs the upstream: give them longer than the
    # held phase's half second, which a loaded machine can take (a reply that says
    # "running, call again" is honest, but this test is about what they end with).
    settings.AIRLOCK_GATEWAY_WAIT_SECONDS = 15

    async def racing(client: Any) -> list[Any]:
        results: list[Any] = []

        async def one() -> None:
            results.append(await client.call_tool(*DELETE))

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(one)
        return results

    results = mcp_session(url, token, racing, headers={"Airlock-Run": str(run_id)})
    assert len(results) == 10
    assert {text(r) for r in results if not r.is_error} <= {"deleted beta"}
    assert any(text(r) == "deleted beta" for r in results)
    assert len(upstream.calls("delete_record")) == 1
    assert ClientCall.objects.filter(run_id=run_id, tool="web__delete_record").count() == 1


def test_a_retry_is_judged_by_when_it_arrived_not_when_it_got_the_runs_lock(
    live_server: Any, gw, upstream, token, rita: User, wait_seconds
) -> None:
    """Of racing retries on a slow host, one can reach the run's lock after another was
    answered and the outcome marked delivered: it arrived before that, so it is the
    same call's retry and gets the same outcome. A call that arrives after the outcome
    was delivered is a new intent, policed anew (held again, not run)."""

    async def held(client: Any) -> Any:
        return await client.call_tool(*DELETE)

    first = mcp_session(f"{live_server.url}/mcp/gw/", token, held).structured_content["airlock"]
    approval_decide(approval_id=first["approval_id"], decision="approve", user=rita)

    def request() -> core.Admitted:
        return core.admit(f"Bearer {token}", "gw", sid=None, run_header=str(first["run_id"]), opening=False,
                          client_name="", protocol_version="", modern=True)

    early = request()  # arrives before anyone ran the approved call
    started = core.call_start(request(), *DELETE)
    assert not isinstance(started, core.Reply)
    answered, run_id = started
    assert core.reply(answered, run_id).text == "deleted beta"
    call = ClientCall.objects.get(run_id=run_id)
    assert call.delivered_at is not None and early.arrived < call.delivered_at

    late = core.call_start(early, *DELETE)  # its proposal takes the lock only now
    assert not isinstance(late, core.Reply)
    assert late[0].key == answered.key and core.reply(*late).text == "deleted beta"
    assert ClientCall.objects.filter(run_id=run_id).count() == 1

    again = core.call_start(request(), *DELETE)
    assert not isinstance(again, core.Reply)
    assert again[0].status == "pending" and again[0].key != answered.key
    assert ClientCall.objects.filter(run_id=run_id).count() == 2
    assert len(upstream.calls("delete_record")) == 1


def test_a_write_after_reading_the_open_web_is_held(live_server: Any, gw, upstream, token, wait_seconds) -> None:
    async def session(client: Any) -> Any:
        before = await client.call_tool("web__add_tag", {"record_id": "alpha", "tag": "x"})
        read = await client.call_tool("web__web_search", {"query": "records"})
        after = await client.call_tool("web__add_tag", {"record_id": "beta", "tag": "y"})
        return before, read, after

    before, read, after = mcp_session(f"{live_server.url}/mcp/gw/", token, session)
    assert text(before) == "tagged alpha with x"
    assert "IGNORE PREVIOUS INSTRUCTIONS" in text(read)  # passed on as inert text
    assert after.structured_content["airlock"]["status"] == "pending_approval"
    approval = Approval.objects.get(status="pending")
    assert approval.tool == "web__add_tag" and approval.taint_source
    assert [c["args"] for c in upstream.calls("add_tag")] == [{"record_id": "alpha", "tag": "x"}]


def test_a_rejected_call_is_a_tool_error_with_the_note_then_a_new_intent(
    live_server: Any, gw, upstream, token, rita: User, wait_seconds
) -> None:
    url = f"{live_server.url}/mcp/gw/"

    async def held(client: Any) -> Any:
        return await client.call_tool(*DELETE)

    first = mcp_session(url, token, held)
    airlock = first.structured_content["airlock"]
    approval_decide(approval_id=airlock["approval_id"], decision="reject", user=rita, note="beta stays")

    async def again(client: Any) -> Any:
        return [await client.call_tool(*DELETE) for _ in range(2)]

    results = mcp_session(url, token, again, headers={"Airlock-Run": str(airlock["run_id"])})
    assert results[0].is_error and "beta stays" in text(results[0])
    assert results[0].structured_content["airlock"]["status"] == "rejected"
    # The rejection was delivered: the same call again is a new intent, held for a human anew.
    assert results[1].structured_content["airlock"]["status"] == "pending_approval"
    assert Approval.objects.filter(run_id=airlock["run_id"], status="pending").count() == 1
    assert upstream.calls("delete_record") == []


def test_another_call_while_one_waits_is_told_which_call_waits(
    live_server: Any, gw, upstream, token, wait_seconds
) -> None:
    async def session(client: Any) -> Any:
        held = await client.call_tool(*DELETE)
        other = await client.call_tool("web__lookup", {"record_id": "alpha"})
        return held, other

    held, other = mcp_session(f"{live_server.url}/mcp/gw/", token, session)
    assert other.is_error
    airlock = other.structured_content["airlock"]
    assert airlock["status"] == "busy"
    assert airlock["waiting"]["approval_id"] == held.structured_content["airlock"]["approval_id"]
    assert "web__delete_record" in text(other) and "same arguments" in text(other)


def test_a_tool_outside_the_profiles_list_reaches_no_upstream(
    live_server: Any, upstream, token, wait_seconds
) -> None:
    AgentProfile.objects.create(name="narrow", provider="external", tools=["web__lookup"])

    async def session(client: Any) -> Any:
        names = [t.name for t in (await client.list_tools()).tools]
        offered_elsewhere = await client.call_tool(*DELETE)
        not_pinned = await client.call_tool("web__format_disk", {})
        return names, offered_elsewhere, not_pinned

    names, offered_elsewhere, not_pinned = mcp_session(f"{live_server.url}/mcp/narrow/", token, session)
    assert names == ["web__lookup"]
    for result in (offered_elsewhere, not_pinned):
        assert result.is_error and result.structured_content["airlock"]["status"] == "unknown_tool"
    assert upstream.calls() == []
    assert not ClientCall.objects.exists() and not Run.objects.exists()  # nothing was even proposed


def test_the_upstreams_secret_and_headers_never_reach_the_client(
    live_server: Any, gw, upstream, token, wait_seconds
) -> None:
    url = f"{live_server.url}/mcp/gw/"
    seen: list[str] = []
    with httpx.Client(headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
                      timeout=30) as http:

        def rpc(body: dict[str, Any], sid: str | None = None) -> httpx.Response:
            response = http.post(url, json=body, headers={"Mcp-Session-Id": sid} if sid else {})
            seen.append(str(response.headers) + response.text)
            return response

        opened = rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        sid = opened.headers["mcp-session-id"]
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        listed = rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
        failed = rpc({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "web__broken", "arguments": {"reason": "down"}}}, sid)
    assert listed.status_code == 200 and failed.status_code == 200
    assert failed.json()["result"]["isError"] is True  # a tool error, not a protocol error
    everything = "\n".join(seen)
    assert "s3cret-upstream-token" not in everything
    assert "UPSTREAM_BEARER" not in everything
    assert upstream.url not in everything  # nor where the upstream lives
