"""History rules through the MCP gateway: a gateway call is proposed as every call is
(external.call_propose), so the caller's stream is counted and a held or denied call
says why in numbers."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import AgentProfile, Approval
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]

RUNAWAY = {"tool": "*", "then": "deny", "reason": "runaway client",
           "history": {"within": "1h", "scope": "caller", "calls_over": 2}}
AFTER_READ = {"tool": "web__delete_record", "then": "ask", "reason": "a delete after reading outside text",
              "history": {"scope": "run", "after": ["fetch_fixture"]}}


def test_the_third_call_of_a_runaway_caller_is_denied_with_the_figures(live_server: Any, gw, upstream, token) -> None:
    AgentProfile.objects.filter(pk=gw.pk).update(rules=[RUNAWAY])

    async def calls(client: Any) -> Any:
        return [await client.call_tool("echo", {"text": str(i)}) for i in range(3)]

    first, second, third = mcp_session(f"{live_server.url}/mcp/gw/", token, calls)
    assert not first.is_error and not second.is_error
    assert "runaway client: the 3rd call in 1 h by this caller (over 2)" in text(third)


def test_a_delete_after_reading_outside_text_is_held_with_the_figures(live_server: Any, gw, upstream, token) -> None:
    AgentProfile.objects.filter(pk=gw.pk).update(rules=[AFTER_READ])

    async def calls(client: Any) -> Any:
        read = await client.call_tool("fetch_fixture", {"text": "a page"})
        return read, await client.call_tool("web__delete_record", {"record_id": "beta"})

    read, held = mcp_session(f"{live_server.url}/mcp/gw/", token, calls)
    assert not read.is_error
    assert held.structured_content["airlock"]["status"] == "pending_approval"
    approval = Approval.objects.get(status="pending")
    assert approval.history["ran"] == "fetch_fixture"
    assert upstream.calls("delete_record") == []
