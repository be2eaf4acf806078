"""Which MCP tools a read asks for: a profile's names and `NAME__*` patterns reach the
database as they are, so a gateway call reads its profile's rows, not every server's;
within `read_once(tools)` a name outside the scope is still read, on its own."""

from __future__ import annotations

import pytest

from agents.lib.mcp_mapping import definition_sha256
from agents.models import McpServer, McpTool
from agents.tools import mcp as mcp_tools

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"record_id": {"type": "string"}}}


@pytest.fixture
def servers() -> None:
    # `crm_x`'s tools start with `crm_x__`: a LIKE 'crm__%' would take them for crm's
    # (`_` is LIKE's one-character wildcard), and SQLite's LIKE would ignore case.
    for name, tools in (("crm", ["lookup", "delete"]), ("crm_x", ["lookup"]), ("Crm", ["export"])):
        server = McpServer.objects.create(name=name, transport="http", url="http://127.0.0.1:9/mcp")
        for tool in tools:
            found = {"name": tool, "inputSchema": SCHEMA}
            McpTool.objects.create(server=server, mcp_name=tool, name=f"{name}__{tool}", description=tool,
                                   input_schema=SCHEMA, sha256=definition_sha256(found))


def names(tools: list[str] | None = None) -> list[str]:
    return sorted(spec.name for spec in mcp_tools.specs(tools))


def test_a_pattern_reads_exactly_its_servers_tools(servers) -> None:
    assert names(["crm__*"]) == ["crm__delete", "crm__lookup"]
    assert names(["crm_x__*", "Crm__export", "echo"]) == ["Crm__export", "crm_x__lookup"]
    assert names(["crm__*", "crm__lookup"]) == ["crm__delete", "crm__lookup"]
    assert names(["crm__nothing", "echo"]) == []
    assert names() == ["Crm__export", "crm__delete", "crm__lookup", "crm_x__lookup"]


def test_a_scope_answers_its_own_tools_and_reads_any_other_on_its_own(servers) -> None:
    with mcp_tools.read_once(["crm__*", "echo"]):
        assert names() == ["crm__delete", "crm__lookup"]
        assert names(["crm__lookup", "echo"]) == ["crm__lookup"]
        assert names(["crm__*"]) == ["crm__delete", "crm__lookup"]
        # Outside the scope (a tool the profile dropped while its run's call waited):
        # read on its own, as without a scope.
        assert names(["crm_x__lookup"]) == ["crm_x__lookup"]
    with mcp_tools.read_once():
        assert names() == ["Crm__export", "crm__delete", "crm__lookup", "crm_x__lookup"]
