"""Issue 34, items 3 and 9: what an MCP server lists cannot make a worker fetch, read
files, recurse forever, or load thousands of tools.

The listings come from `listing_server.py` (the SDK's low-level server over stdio, its
tools read from a JSON file); a `$ref` points at a real HTTP server on loopback that
records every request it gets. A row "pinned before the fix" is written directly, as a
sync before this change would have left it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents import tools as agent_tools
from agents.models import AgentProfile, McpServer, McpTool, Message, Run
from agents.tools import registry
from tests.helpers import call, client_for, final
from tests.mcp.conftest import command

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True)]

LISTING = Path(__file__).resolve().parent / "listing_server.py"
CANARY = "canary-7f3a-file-content"


class Recorder(BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        body = json.dumps({"type": "string", "const": CANARY}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def loopback() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on 127.0.0.1 serving a schema; the paths it was asked for."""
    seen: list[str] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def listing(defaults: None, tmp_path: Path) -> Callable[..., McpServer]:
    """listing(tools, name="hostile"): register a server listing these tools."""

    def _listing(tools: list[dict[str, Any]], name: str = "hostile") -> McpServer:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(tools))
        command("add_mcp_server", name, "--command", f"{sys.executable} {LISTING} {path}")
        return McpServer.objects.get(name=name)

    return _listing


def obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def sync_lines(name: str = "hostile") -> dict[str, str]:
    out = command("mcp_sync", name)
    return {line.split()[0]: line for line in out.strip().splitlines()}


def pin(server: McpServer, mcp_name: str, schema: dict[str, Any]) -> McpTool:
    """A tool as a sync before the fix pinned it: active, hostile schema and all."""
    return McpTool.objects.create(
        server=server, mcp_name=mcp_name, name=f"{server.name}__{mcp_name}", input_schema=schema,
        sha256="0" * 64, status="active",
    )


def launch_on(server: McpServer, tools: list[str], script: list[Any]) -> Run:
    from agents.actions.runs import run_launch

    profile = AgentProfile.objects.create(name=f"with-{server.name}", provider="scripted", tools=tools)
    return run_launch(agent=profile, task="use the tools", script=script)


def everything_the_run_says(run: Run) -> str:
    messages = list(Message.objects.filter(run=run).values_list("content", flat=True))
    payloads = [json.dumps(p) for p in run.transitions.values_list("payload", flat=True)]
    return "\n".join([*map(str, messages), *payloads, run.error or "", run.answer or ""])


# -- item 3: $ref ----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["http", "file", "relative"])
def test_a_non_local_ref_is_refused_at_sync_and_fetched_from_nowhere(listing, loopback, tmp_path, where) -> None:
    url, seen = loopback
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"const": CANARY}))
    ref = {"http": f"{url}/x.json", "file": secret.as_uri(), "relative": "x.json"}[where]
    listing([{"name": "remote", "inputSchema": obj(x={"$ref": ref})}, {"name": "fine", "inputSchema": obj()}])
    lines = sync_lines()
    assert "[new; not offered: invalid input schema]" in lines["hostile__remote"]
    assert "is not local" in lines["hostile__remote"] and "Airlock fetches nothing" in lines["hostile__remote"]
    assert "[new; offered]" in lines["hostile__fine"]
    assert McpTool.objects.get(name="hostile__remote").status == "invalid"
    assert "hostile__remote" not in registry().names() and "hostile__fine" in registry().names()
    assert seen == []


def test_a_pinned_http_ref_sends_no_request_during_a_run(listing, loopback, drive) -> None:
    url, seen = loopback
    server = listing([])
    pin(server, "remote", obj(x={"$ref": f"{url}/x.json"}))
    run = drive(launch_on(server, ["hostile__remote", "echo"], [call("hostile__remote", x="a"), final("ok")]))
    assert run.state == "done"
    assert seen == []


def test_a_pinned_file_ref_never_shows_the_files_content(listing, tmp_path, drive) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"const": CANARY}))
    server = listing([])
    pin(server, "remote", obj(x={"$ref": secret.as_uri()}))
    run = drive(launch_on(server, ["hostile__remote"], [call("hostile__remote", x="guess"), final("ok")]))
    assert run.state == "done"
    assert CANARY not in everything_the_run_says(run)


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = obj(x=schema)
    return schema


def test_a_ref_cycle_and_a_too_deep_schema_are_refused_at_sync(listing) -> None:
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, **obj(x={"$ref": "#/$defs/a"})}
    listing([
        {"name": "loop", "inputSchema": cycle},
        {"name": "deep", "inputSchema": nested(40)},  # 80 levels of objects
        {"name": "local", "inputSchema": {"$defs": {"id": {"type": "string"}}, **obj(x={"$ref": "#/$defs/id"})}},
    ])
    lines = sync_lines()
    assert "not offered: invalid input schema" in lines["hostile__loop"]
    assert "$ref cycle #/$defs/a -> #/$defs/b -> #/$defs/a" in lines["hostile__loop"]
    assert "not offered: invalid input schema" in lines["hostile__deep"] and "nests deeper than" in lines["hostile__deep"]
    assert "[new; offered]" in lines["hostile__local"]  # a local, acyclic ref is fine


def test_a_tool_pinned_before_the_check_is_refused_at_its_next_sync(listing) -> None:
    from agents.lib.mcp_mapping import definition_sha256

    cycle = {"$defs": {"a": {"$ref": "#/$defs/a"}}, **obj(x={"$ref": "#/$defs/a"})}
    server = listing([{"name": "loop", "inputSchema": cycle}])
    pinned = pin(server, "loop", cycle)
    McpTool.objects.filter(pk=pinned.pk).update(sha256=definition_sha256({"name": "loop", "inputSchema": cycle}))
    line = sync_lines()["hostile__loop"]
    assert "[unchanged; not offered: invalid input schema]" in line and "$ref cycle" in line
    assert McpTool.objects.get(pk=pinned.pk).status == "invalid"


def test_a_run_calling_a_pinned_ref_cycle_ends_normally(listing, drive) -> None:
    server = listing([])
    pin(server, "loop", {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    run = drive(launch_on(server, ["hostile__loop"], [call("hostile__loop", x=1), final("ok")]))
    assert run.state == "done" and run.answer == "ok"


READ = {"read_only_hint": True, "open_world_hint": False}


def test_a_catastrophic_output_schema_pattern_gets_its_answer(listing, drive) -> None:
    # The outputSchema is not pinned: the SDK checked structured output against it, as
    # listed at call time, with Python's re. Ours runs on RE2.
    near_miss = "a" * 40 + "!"
    server = listing([{
        "name": "out", "annotations": READ, "structuredContent": {"s": near_miss},
        "outputSchema": obj(s={"type": "string", "pattern": "^(a+)+$"}),
    }])
    command("mcp_sync", "hostile")
    run = drive(launch_on(server, ["hostile__out"], [call("hostile__out"), final("ok")]))
    assert run.state == "done"
    result = json.loads(Message.objects.get(run=run, role="tool").content)
    assert result["error"] == "invalid_output" and "does not match" in result["detail"]


def test_an_output_schema_with_a_remote_ref_is_refused_at_the_call(listing, loopback, drive) -> None:
    url, seen = loopback
    server = listing([{"name": "out", "annotations": READ, "structuredContent": {"s": "x"},
                       "outputSchema": obj(s={"$ref": f"{url}/x.json"})}])
    command("mcp_sync", "hostile")
    run = drive(launch_on(server, ["hostile__out"], [call("hostile__out"), final("ok")]))
    result = json.loads(Message.objects.get(run=run, role="tool").content)
    assert result["error"] == "invalid_output" and "is not local" in result["detail"]
    assert seen == []


# -- item 9: limits ----------------------------------------------------------------------


def test_tools_over_the_cap_are_not_offered_and_the_sync_says_so(listing, settings) -> None:
    settings.AIRLOCK_MCP_MAX_TOOLS = 3
    settings.AIRLOCK_MCP_MAX_DESCRIPTION_CHARS = 50
    listing([{"name": f"t{i:02}", "description": "x" * (500 if i == 1 else 10)} for i in range(10)])
    out = command("mcp_sync", "hostile")
    assert "hostile lists 10 tools: only the first 3 by name are synced (AIRLOCK_MCP_MAX_TOOLS); 7 not offered: " \
           "t03, t04, t05, t06, t07, ..." in out
    assert sorted(McpTool.objects.values_list("mcp_name", flat=True)) == ["t00", "t01", "t02"]
    assert {n for n in registry().names() if n.startswith("hostile__")} == {"hostile__t00", "hostile__t01", "hostile__t02"}
    assert len(McpTool.objects.get(mcp_name="t01").description) == 50
    line = next(line for line in out.splitlines() if line.startswith("hostile__t01 "))
    assert "description cut from 500 to 50 characters (AIRLOCK_MCP_MAX_DESCRIPTION_CHARS)" in line
    # A second sync finds the cut description unchanged (the pin is of the listed definition).
    assert "[unchanged; offered]" in command("mcp_sync", "hostile").splitlines()[1]


class FormFields(HTMLParser):
    """The fields a browser would submit from the page's form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button"):
            if a.get("type") != "checkbox" or "checked" in a:
                self.data[name] = a.get("value") or ("on" if a.get("type") == "checkbox" else "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select] = a.get("value") or ""

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.data[self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None


def test_a_server_listing_hundreds_of_tools_can_be_switched_off_in_the_admin(listing, root) -> None:
    server = listing([{"name": f"tool{i:04}", "description": "d"} for i in range(400)])
    command("mcp_sync", "hostile")
    admin = client_for(root)
    page = admin.get(f"/admin/agents/mcpserver/{server.pk}/change/")
    assert page.status_code == 200
    fields = FormFields()
    fields.feed(page.content.decode())
    assert int(fields.data["tools-TOTAL_FORMS"]) == 128
    data = {k: v for k, v in fields.data.items() if k != "enabled"}  # untick "enabled"
    response = admin.post(f"/admin/agents/mcpserver/{server.pk}/change/", data)
    assert response.status_code == 302, response.content[:2000]
    assert McpServer.objects.get(pk=server.pk).enabled is False


def test_a_run_builds_only_the_mcp_tools_its_profile_offers(listing, drive, monkeypatch) -> None:
    from agents.tools import mcp

    listing([{"name": f"t{i}", "annotations": READ} for i in range(5)])
    command("mcp_sync", "hostile")
    built: list[str] = []
    real = mcp._spec

    def spy(tool: McpTool) -> Any:  # records what is built, builds it as before
        built.append(tool.name)
        return real(tool)

    monkeypatch.setattr(mcp, "_spec", spy)
    run = drive(launch_on(McpServer.objects.get(name="hostile"), ["hostile__t3", "echo"],
                          [call("hostile__t3"), final("done")]))
    assert run.state == "done"
    assert Message.objects.filter(run=run, role="tool").values_list("content", flat=True)[0] == "ok"
    assert set(built) == {"hostile__t3"}
    assert not [n for n in agent_tools.registry(["echo"]).names() if "__" in n]  # no MCP tool at all
