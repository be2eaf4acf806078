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


def test_a_third_write_to_one_record_in_a_day_is_held_with_the_figures(live_server: Any, gw, upstream, token) -> None:
    """The issue's "third refund of one order in a day", on the example server's tags."""
    third = {"tool": "web__add_tag", "then": "ask", "reason": "a third tag of one record in a day",
             "history": {"within": "24h", "scope": "profile", "same": ["record_id"], "calls_over": 2}}
    AgentProfile.objects.filter(pk=gw.pk).update(rules=[third])

    async def calls(client: Any) -> Any:
        return [await client.call_tool("web__add_tag", {"record_id": record, "tag": f"t{i}"})
                for i, record in enumerate(["alpha", "alpha", "beta", "alpha"])]

    *ran, held = mcp_session(f"{live_server.url}/mcp/gw/", token, calls)
    assert not any(r.is_error for r in ran)
    assert held.structured_content["airlock"]["status"] == "pending_approval"
    approval = Approval.objects.get(status="pending")
    assert approval.reason == (
        "a third tag of one record in a day: the 3rd web__add_tag call with record_id alpha in 24 h (over 2)"
    )
    assert [c["args"]["record_id"] for c in upstream.calls("add_tag")] == ["alpha", "alpha", "beta"]


def test_a_sum_over_the_callers_calls_is_denied_with_the_figures(live_server: Any, gw, upstream, token) -> None:
    """The issue's "over 500 EUR to one customer this week", summed over a numeric argument."""
    over = {"tool": "web__slow", "then": "deny", "reason": "too much waiting this week",
            "history": {"within": "7d", "scope": "project", "sum_over": {"seconds": 0.05}}}
    AgentProfile.objects.filter(pk=gw.pk).update(rules=[over])

    async def calls(client: Any) -> Any:
        return [await client.call_tool("web__slow", {"seconds": 0.02}) for _ in range(3)]

    first, second, third = mcp_session(f"{live_server.url}/mcp/gw/", token, calls)
    assert not first.is_error and not second.is_error
    assert "too much waiting this week: 0.06 seconds in web__slow calls in 7 d in this project, this one included" \
        " (over 0.05)" in text(third)
