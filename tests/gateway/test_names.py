"""A profile that keeps one server's names (`expose_names`): tools/list shows the
upstream's own names, a call by that name is governed as `SERVER__tool` (policy,
approval, journal), and the prefixed form, not being listed, is refused. Only a profile
whose tools are one server's may keep its names."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from agents.models import AgentProfile, Approval, McpServer, McpTool, ToolCall
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [pytest.mark.django_db(transaction=True)]


@requires_postgres()  # the gateway's live server: its own threads read committed rows
def test_the_upstreams_own_names_are_listed_and_called_and_governed_under_server_names(
    live_server: Any, upstream, token, wait_seconds
) -> None:
    AgentProfile.objects.create(name="own", provider="external", tools=["web__*"], expose_names=True)

    async def session(client: Any) -> Any:
        listed = [t.name for t in (await client.list_tools()).tools]
        read = await client.call_tool("lookup", {"record_id": "alpha"})
        prefixed = await client.call_tool("web__lookup", {"record_id": "alpha"})
        held = await client.call_tool("delete_record", {"record_id": "beta"})
        return listed, read, prefixed, held

    listed, read, prefixed, held = mcp_session(f"{live_server.url}/mcp/own/", token, session)
    assert "lookup" in listed and "delete_record" in listed
    assert not [n for n in listed if n.startswith("web__")]
    assert not read.is_error and text(read) == "the first record"
    assert ToolCall.objects.get(status="succeeded").tool == "web__lookup"  # journaled under the governed name
    assert prefixed.is_error and prefixed.structured_content["airlock"]["status"] == "unknown_tool"
    assert held.structured_content["airlock"]["status"] == "pending_approval"
    assert Approval.objects.get().tool == "web__delete_record"  # the reviewer sees the governed name
    assert upstream.calls("delete_record") == []


@requires_postgres()
def test_a_profile_without_it_lists_server_names(live_server: Any, gw, upstream, token) -> None:
    async def session(client: Any) -> Any:
        return [t.name for t in (await client.list_tools()).tools], await client.call_tool("lookup", {})

    listed, bare = mcp_session(f"{live_server.url}/mcp/gw/", token, session)
    assert "web__lookup" in listed and "lookup" not in listed
    assert bare.is_error and bare.structured_content["airlock"]["status"] == "unknown_tool"


@pytest.mark.parametrize("tools,provider", [
    (["web__*", "echo"], "external"),  # a built-in tool beside the server's
    (["web__*", "crm__*"], "external"),  # two servers: two tools could share a name
    (None, "external"),  # every registered tool
    (["web__*"], "scripted"),  # only the gateway lists names
])
def test_only_one_servers_tools_may_keep_their_names(defaults: None, tools: Any, provider: str) -> None:
    profile = AgentProfile(name="own", provider=provider, tools=tools, expose_names=True)
    with pytest.raises(ValidationError) as refused:
        profile.full_clean()
    assert "expose_names" in refused.value.message_dict


def test_one_servers_tools_by_pattern_and_by_name_may_keep_their_names(defaults: None) -> None:
    # Names a profile may list are known ones (#47): the server's two pinned tools.
    web = McpServer.objects.create(name="web", transport="http", url="http://127.0.0.1:9/mcp")
    for tool in ("lookup", "add_tag"):
        McpTool.objects.create(server=web, mcp_name=tool, name=f"web__{tool}", input_schema={"type": "object"},
                               sha256="0" * 64)
    profile = AgentProfile(name="own", provider="external", tools=["web__lookup", "web__add_tag"], expose_names=True)
    profile.full_clean()
    assert profile.exposed_server() == "web"


def test_the_admin_offers_the_switch(defaults: None, root: Any) -> None:
    from django.test import Client

    profile = AgentProfile.objects.create(name="own", provider="external", tools=["web__*"])
    browser = Client()
    browser.force_login(root)
    page = browser.get(f"/admin/agents/agentprofile/{profile.pk}/change/")
    assert page.status_code == 200 and 'name="expose_names"' in page.content.decode()
