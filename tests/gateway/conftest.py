"""The MCP gateway's fixtures: a real upstream MCP server (examples/mcp_server.py over
streamable HTTP on loopback, recording each call it runs), an external profile offering
its tools, and an MCP client built on the official SDK pointed at the gateway."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agents.actions.tokens import token_create
from agents.models import AgentProfile, McpServer
from tests.helpers import CRM_UPDATE

BASE = Path(__file__).resolve().parents[2]
EXAMPLE = BASE / "examples" / "mcp_server.py"
# The upstream's tools that matter here: `web__lookup` (read), `web__delete_record`
# (destructive: asks), `web__web_search` (open world: taints), `web__add_tag` (write).


class Upstream:
    """The example server; `calls()` is what its recording tools ran, one dict per call."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, *extra: str) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--http", "--port", "0", "--record", str(self.record),
             "--max-seconds", "300", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=BASE,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line.startswith("listening "), f"the example server did not start: {line!r}"
        self.url = line.split()[1]
        return self.url

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        found = [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]
        return [c for c in found if tool is None or c["tool"] == tool]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def upstream(defaults: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Upstream]:
    """`web`: the example server, registered with a secret header (read from the
    environment per call, never shown to the gateway's clients) and synced."""
    server = Upstream(tmp_path / "calls.jsonl")
    url = server.start("--require-bearer", "s3cret-upstream-token")
    McpServer.objects.create(name="web", transport="http", url=url, headers={"Authorization": "UPSTREAM_BEARER"})
    monkeypatch.setenv("UPSTREAM_BEARER", "Bearer s3cret-upstream-token")
    command("mcp_sync", "web")
    yield server
    server.stop()


SUITE_UPSTREAM = BASE / "tests" / "gateway" / "conformance" / "upstream.py"


@pytest.fixture
def suite_upstream(defaults: None) -> Iterator[str]:
    """`suite`: the conformance upstream (tests/gateway/conformance/upstream.py: the
    tools the official conformance suite calls, returning text, an image, audio,
    embedded resources), on loopback, registered and synced; yields its URL."""
    proc = subprocess.Popen([sys.executable, str(SUITE_UPSTREAM), "--port", "0", "--max-seconds", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=BASE)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("listening "), f"the conformance upstream did not start: {line!r}"
        url = line.split()[1]
        McpServer.objects.create(name="suite", transport="http", url=url)
        command("mcp_sync", "suite")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture
def gw(upstream: Upstream) -> AgentProfile:
    """`gw`: an external profile offering the upstream's tools, two diagnostic tools and
    a client tool (which the gateway must not offer: only the decision API can run it)."""
    return AgentProfile.objects.create(
        name="gw", provider="external", client_tools=[CRM_UPDATE],
        tools=["web__*", "echo", "fetch_fixture", "crm_update"],
    )


@pytest.fixture
def token(lena: User) -> str:
    _token, raw = token_create(user=lena)
    return raw


@pytest.fixture(autouse=True)
def _one_round_holds(settings: Any) -> None:
    """A call held in the 2026-07-28 era answers after one wait, as in the handshake era,
    unless a test holds it over input_required rounds (AIRLOCK_GATEWAY_HOLD_SECONDS:
    tests/gateway/test_streams.py)."""
    settings.AIRLOCK_GATEWAY_HOLD_SECONDS = 0.0


@pytest.fixture
def wait_seconds(settings: Any) -> float:
    settings.AIRLOCK_GATEWAY_WAIT_SECONDS = 0.5
    return 0.5


Session = Callable[[Client], Awaitable[Any]]


def mcp_session(
    url: str, token: str, fn: Session, *, headers: dict[str, str] | None = None, mode: str = "auto"
) -> Any:
    """Run `fn(client)` in one connection of the official SDK's client against `url`:
    `mode` "auto" (the client's default: the 2026-07-28 era where the server speaks
    it) or "legacy" (the initialize handshake and a session)."""

    async def go() -> Any:
        with anyio.fail_after(60):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", **(headers or {})},
                                      timeout=httpx2.Timeout(30.0))
            connection = Client(streamable_http_client(url, http_client=http), cache=None, mode=mode)
            async with http, connection as client:
                return await fn(client)

    return run_async(go)


def run_async(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """anyio.run(fn, *args) in a thread of its own: the browser tests' Playwright keeps an
    event loop running in the test thread for the whole session."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn, *args).result()


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def modern_rpc(
    url: str, token: str, method: str, params: dict[str, Any], *, tasks: bool = True, name: str | None = None
) -> dict[str, Any]:
    """One 2026-07-28 request as it goes on the wire (each request stands alone: the
    envelope in `_meta`, the routing headers), declaring the tasks extension unless
    `tasks` is false (`name`: an Mcp-Name header other than the request's); the
    JSON-RPC answer (its `result` or `error`)."""
    capabilities: dict[str, Any] = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if tasks else {}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": {"name": "raw-wire", "version": "1"}}
    name = name or params.get("name") or params.get("taskId")
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, **({"Mcp-Name": name} if name else {})}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    response = httpx.post(url, json=body, headers=headers, timeout=60.0)
    answer = response.json()
    # A result is a 200; the SDK sends a JSON-RPC error of the request's own with a 4xx.
    assert (response.status_code == 200) == ("result" in answer), response.text
    return answer
