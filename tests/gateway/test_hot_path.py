"""The hot path's cuts keep their guarantees (docs/performance.md, "The hot path"): an
allowed call of a retry-safe tool is marked delivered by its result's own commit (one
durable commit fewer); an unsafe tool's mark stays a commit of its own after that one,
so a process that dies in between leaves a retry answered from the journal. Either
way the next identical call is a new intent, and the intent row is durable before the
upstream is called."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import ClientCall, McpTool, ToolCall
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]
LOOKUP = ("web__lookup", {"record_id": "alpha"})


def twice(live_server: Any, token: str) -> tuple[Any, Any]:
    async def go(client: Any) -> tuple[Any, Any]:
        return await client.call_tool(*LOOKUP), await client.call_tool(*LOOKUP)

    return mcp_session(f"{live_server.url}/mcp/gw/", token, go)


@pytest.mark.parametrize("retry", ["safe", "unsafe"])
def test_an_answered_call_is_delivered_once_and_its_twin_runs_anew(
    live_server: Any, gw, upstream, token, retry: str
) -> None:
    McpTool.objects.filter(name="web__lookup").update(retry_safety_override=retry)
    first, second = twice(live_server, token)
    assert not first.is_error and not second.is_error, (text(first), text(second))
    # Delivered, each: the identical second call was a new intent, run again (its own
    # journal entry), not answered from the first's.
    calls = list(ClientCall.objects.order_by("id"))
    entries = list(ToolCall.objects.order_by("id"))
    assert len(calls) == len(entries) == 2
    for call, entry in zip(calls, entries, strict=True):
        assert entry.status == "succeeded" and call.key == entry.idempotency_key
        assert call.delivered_at is not None
        if retry == "safe":
            # Written by the result's commit: the same statement's moment.
            assert call.delivered_at == entry.finished_at
        else:
            # A commit of its own, after the result's: a retry after a death between
            # the two is answered from the journal, not run again.
            assert call.delivered_at > entry.finished_at
