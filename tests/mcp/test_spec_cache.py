"""The offered MCP tools' specs are built once per version of their rows (PostgreSQL):
a read of unchanged rows builds nothing, and any change to a tool's row or its server's
is what the next read offers."""

from __future__ import annotations

from typing import Any

import pytest

from agents.lib.mcp_mapping import definition_sha256
from agents.models import McpServer, McpTool
from agents.tools import mcp as mcp_tools
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db]

SCHEMA = {"type": "object", "properties": {"record_id": {"type": "string"}}, "required": ["record_id"]}


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the specs built from rows, in order."""
    names: list[str] = []
    real = mcp_tools._spec

    def counting(tool: McpTool) -> Any:
        names.append(tool.name)
        return real(tool)

    monkeypatch.setattr(mcp_tools, "_spec", counting)
    return names


@pytest.fixture
def tools() -> tuple[McpServer, McpTool, McpTool]:
    server = McpServer.objects.create(name="crm", transport="http", url="http://127.0.0.1:9/mcp", timeout_seconds=7.0)

    def tool(name: str, hints: dict[str, Any]) -> McpTool:
        found = {"name": name, "inputSchema": SCHEMA, "annotations": hints}
        return McpTool.objects.create(server=server, mcp_name=name, name=f"crm__{name}", description=name,
                                      input_schema=SCHEMA, annotations=hints, sha256=definition_sha256(found))

    lookup = tool("lookup", {"readOnlyHint": True, "openWorldHint": False})
    delete = tool("delete", {"destructiveHint": True, "openWorldHint": False})
    return server, lookup, delete


def offered() -> dict[str, Any]:
    return {spec.name: spec for spec in mcp_tools.specs()}


def test_unchanged_rows_are_built_once(tools, built) -> None:
    first = offered()
    assert set(first) == {"crm__lookup", "crm__delete"} and sorted(built) == ["crm__delete", "crm__lookup"]
    again = offered()
    with mcp_tools.read_once():
        scoped = offered()
    assert len(built) == 2  # nothing built since the first read
    assert again["crm__lookup"] is first["crm__lookup"] and scoped["crm__delete"] is first["crm__delete"]
    # Asked by name (a run's own tools) it is the same spec, from the same rows.
    assert [s.name for s in mcp_tools.specs(["crm__lookup", "echo"])] == ["crm__lookup"]
    assert len(built) == 2


def test_a_change_to_a_tool_or_its_server_is_the_next_reads(tools, built) -> None:
    server, lookup, delete = tools
    before = offered()
    assert before["crm__delete"].risk == "irreversible" and before["crm__lookup"].timeout == pytest.approx(17.0)
    McpTool.objects.filter(pk=delete.pk).update(risk_override="write")
    after = offered()
    assert after["crm__delete"].risk == "write"
    assert after["crm__lookup"] is before["crm__lookup"]  # its rows did not change
    McpServer.objects.filter(pk=server.pk).update(timeout_seconds=2.0)
    assert offered()["crm__lookup"].timeout == pytest.approx(mcp_tools.TEARDOWN_GRACE_SECONDS + 2.0)
    McpTool.objects.filter(pk=lookup.pk).update(enabled=False)
    assert set(offered()) == {"crm__delete"}
    McpTool.objects.filter(pk=delete.pk).update(status="changed")
    assert offered() == {}


def test_a_refused_row_stays_out_and_is_logged_once_a_version(tools, built, caplog) -> None:
    _server, lookup, _delete = tools
    McpTool.objects.filter(pk=lookup.pk).update(input_schema=["not", "a", "schema"])  # pinned before the check
    assert set(offered()) == {"crm__delete"} and set(offered()) == {"crm__delete"}
    refusals = [r for r in caplog.records if "crm__lookup left out of the registry" in r.getMessage()]
    assert len(refusals) == 1
