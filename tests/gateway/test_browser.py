"""The "done when" with a reviewer in the browser: an MCP client's held call appears in
the review queue, Approve in Chromium decides it, and the client's next identical call
gets the upstream's result, the upstream called once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents.models import Approval
from tests.gateway.conftest import mcp_session, text
from tests.helpers import PASSWORD, requires_postgres

pytestmark = [pytest.mark.e2e, requires_postgres(), pytest.mark.django_db(transaction=True)]


def test_a_call_held_for_an_mcp_client_is_approved_in_the_browser_and_runs_once(
    new_page, login, live_server: Any, gw, upstream, token, rita: User, wait_seconds
) -> None:
    url = f"{live_server.url}/mcp/gw/"

    async def held(client: Any) -> Any:
        return await client.call_tool("web__delete_record", {"record_id": "beta"})

    airlock = mcp_session(url, token, held).structured_content["airlock"]
    page, watch = new_page()
    login(page, "rita", PASSWORD)
    # The answer's link is AIRLOCK_BASE_URL's; the live server is at another port.
    assert airlock["url"].endswith(f"/reviews/{airlock['approval_id']}/")
    page.goto(f"/reviews/{airlock['approval_id']}/")
    card = page.locator(f'[data-approval-id="{airlock["approval_id"]}"]')
    expect(card).to_contain_text("web__delete_record")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.locator(".decision")).to_contain_text("Approved by rita")
    assert Approval.objects.get(pk=airlock["approval_id"]).status == "approved"

    async def again(client: Any) -> Any:
        return [await client.call_tool("web__delete_record", {"record_id": "beta"}) for _ in range(2)]

    results = mcp_session(url, token, again)
    # The outcome once, to the caller's next identical call on any connection; then a new intent.
    assert text(results[0]) == "deleted beta"
    assert results[1].structured_content["airlock"]["status"] == "pending_approval"
    assert len(upstream.calls("delete_record")) == 1
    assert not watch.console_errors, watch.console_errors
