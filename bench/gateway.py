"""The MCP gateway's figure: an allowed MCP call through `/mcp/<profile>/` against the
same upstream server called directly over streamable HTTP, sequential, one client, side
by side in one run (added p50 latency and the throughput ratio; targets: <= 5 ms added,
>= 0.5 of direct). Not run by the tests; `python bench/gateway.py` prints it.

Both sides use the official SDK's client, one session each, and call the upstream's
`lookup` read tool with a different record id each time (an identical call would be
answered from the journal without reaching the upstream at all). The gateway is served
by uvicorn over `config.asgi`, on this machine's PostgreSQL.
"""

from __future__ import annotations

import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/airlock_bench")
os.environ.setdefault("LOG_LEVEL", "WARNING")

TARGET_ADDED_P50_MS = 5.0
TARGET_THROUGHPUT_RATIO = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def _timed_calls(url: str, headers: dict[str, str], tool: str, n: int) -> list[float]:
    """Seconds per call of `tool`, `n` sequential calls in one SDK session (after a
    few unmeasured warm-up calls)."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def go() -> list[float]:
        took = []
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0))
        async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
            for i in range(n + 5):
                start = time.perf_counter()
                result = await client.call_tool(tool, {"record_id": f"r{i}"})
                elapsed = time.perf_counter() - start
                if result.is_error:
                    raise RuntimeError(f"{tool} failed: {result.content}")
                if i >= 5:
                    took.append(elapsed)
        return took

    return anyio.run(go)


def gateway_vs_direct(n: int = 200) -> dict[str, Any]:
    """The figure as a dict: p50s in ms, calls per second, added p50, throughput ratio."""
    from bench.run import setup_django

    setup_django()
    from django.core.management import call_command
    from django.db import connection

    from agents.models import AgentProfile, McpServer
    from agents.tokens import token_create

    with connection.cursor() as cur:
        cur.execute("truncate agents_run, agents_mcptool, agents_mcpserver, agents_gatewaysession restart identity cascade")
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username="bench-gateway")
    user.groups.add(Group.objects.get(name="launcher"))
    _token, raw = token_create(user=user)

    upstream = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "mcp_server.py"), "--http", "--port", "0", "--max-seconds", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )
    port = _free_port()
    web = None
    try:
        line = upstream.stdout.readline() if upstream.stdout else ""
        upstream_url = line.split()[1]
        McpServer.objects.create(name="bench", transport="http", url=upstream_url)
        call_command("mcp_sync", "bench", verbosity=0)
        AgentProfile.objects.update_or_create(
            name="bench-gateway",
            defaults={"provider": "external", "tools": ["bench__lookup"],
                      "limits": {"max_steps": 10 * (n + 10), "deadline_seconds": 3600}},
        )
        env = {**os.environ, "LOG_LEVEL": "WARNING"}
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_listening(port)
        direct = _timed_calls(upstream_url, {}, "lookup", n)
        through = _timed_calls(f"http://127.0.0.1:{port}/mcp/bench-gateway/", {"Authorization": f"Bearer {raw}"},
                               "bench__lookup", n)
    finally:
        for proc in (web, upstream):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=20)
    direct_p50, through_p50 = statistics.median(direct) * 1000, statistics.median(through) * 1000
    ratio = sum(direct) / sum(through)
    return {
        "calls": n,
        "direct_p50_ms": round(direct_p50, 2),
        "gateway_p50_ms": round(through_p50, 2),
        "added_p50_ms": round(through_p50 - direct_p50, 2),
        "direct_calls_per_s": round(n / sum(direct), 1),
        "gateway_calls_per_s": round(n / sum(through), 1),
        "throughput_ratio": round(ratio, 3),
        "targets": {
            "added_p50_ms": {"target": f"<= {TARGET_ADDED_P50_MS}", "met": through_p50 - direct_p50 <= TARGET_ADDED_P50_MS},
            "throughput_ratio": {"target": f">= {TARGET_THROUGHPUT_RATIO}", "met": ratio >= TARGET_THROUGHPUT_RATIO},
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(gateway_vs_direct(int(sys.argv[1]) if len(sys.argv) > 1 else 200), indent=2))
