"""An upstream's progress reaches the gateway's client while the call runs: a client
that asked for progress hears the upstream's notifications, in order, before the
result; one that did not hears nothing."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import AgentProfile
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


def test_the_upstreams_progress_reaches_a_client_that_asked_for_it(live_server: Any, suite_upstream: str,
                                                                    token: str) -> None:
    AgentProfile.objects.create(name="media", provider="external", tools=["suite__*"])
    heard: list[tuple[float, float | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        heard.append((done, total))

    async def told(client: Any) -> Any:
        return await client.call_tool("suite__test_tool_with_progress", {}, progress_callback=progress)

    async def quiet(client: Any) -> Any:
        return await client.call_tool("suite__test_tool_with_progress", {})

    # Each in a session (a run) of its own: an identical read in one run is answered
    # from its journal, and the upstream would not run again.
    url = f"{live_server.url}/mcp/media/"
    assert text(mcp_session(url, token, told)) == "Progress test completed"
    assert heard == [(0, 100), (50, 100), (100, 100)]
    assert text(mcp_session(url, token, quiet)) == "Progress test completed"
    assert len(heard) == 3  # nothing for a client that asked for none
