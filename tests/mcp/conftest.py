"""Real MCP servers for the tests: `examples/mcp_server.py` (built with the official SDK)
started over stdio by Airlock itself, or over streamable HTTP on a loopback port here,
registered and synced through the same commands an operator uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from agents.models import AgentProfile, McpServer, Run

BASE = Path(__file__).resolve().parents[2]
EXAMPLE = BASE / "examples" / "mcp_server.py"


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


class Calls:
    """What the example server's recording tools saw, one JSON line per call."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


@pytest.fixture
def calls(tmp_path: Path) -> Calls:
    return Calls(tmp_path / "calls.jsonl")


def stdio_command(calls: Calls, *extra: str) -> str:
    return f"{sys.executable} {EXAMPLE} --record {calls.path} --max-seconds 300 {' '.join(extra)}".strip()


@pytest.fixture
def stdio_server(defaults: None, calls: Calls) -> McpServer:
    """`files`: the example server over stdio, registered and synced."""
    command("add_mcp_server", "files", "--command", stdio_command(calls))
    command("mcp_sync", "files")
    return McpServer.objects.get(name="files")


class HttpServer:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *extra: str) -> str:
        """Start a server on a free loopback port; its URL once it listens."""
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--http", "--port", "0", "--record", str(self.calls.path),
             "--max-seconds", "300", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=BASE,
        )
        self.procs.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""  # blocks until bound (or exited)
        assert line.startswith("listening "), f"the example server did not start: {line!r}"
        return line.split()[1]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)


@pytest.fixture
def http() -> Iterator[HttpServer]:
    servers: list[HttpServer] = []

    def make(calls: Calls) -> HttpServer:
        servers.append(HttpServer(calls))
        return servers[-1]

    yield make  # type: ignore[misc]
    for server in servers:
        server.stop()


@pytest.fixture
def http_server(defaults: None, calls: Calls, http: Callable[[Calls], HttpServer]) -> McpServer:
    """`web`: the example server over streamable HTTP on loopback, registered and synced."""
    url = http(calls).start()
    command("add_mcp_server", "web", "--url", url)
    command("mcp_sync", "web")
    return McpServer.objects.get(name="web")


@pytest.fixture
def mcp_launch(defaults: None) -> Callable[..., Run]:
    """Launch a scripted run on a profile that offers every tool of the given server."""
    from agents.actions.runs import run_launch

    def _launch(server: McpServer, script: list[Any], **kwargs: Any) -> Run:
        profile, _ = AgentProfile.objects.get_or_create(
            name=f"mcp-{server.name}", defaults={"provider": "scripted", "tools": [f"{server.name}__*"]}
        )
        return run_launch(agent=profile, task="use the MCP tools", script=script, **kwargs)

    return _launch


def stray_children() -> list[str]:
    """Children of this test process that a stdio call left behind: a live example
    server (not an HTTP one the test started) or any zombie (an exit never reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) != os.getpid():
            continue
        if state == "Z" or ("mcp_server.py" in cmdline and "--http" not in cmdline):
            found.append(f"{entry.name} {state} {cmdline}")
    return found
