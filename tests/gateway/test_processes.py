"""Sessions live in the database: one MCP session whose requests alternate between two
web processes, one serving `config.wsgi` (runserver, threaded) and one `config.asgi`
(uvicorn), on the same test database, goes on as one session and one run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agents.actions import approval_decide
from agents.models import Approval, GatewaySession, Run
from tests.gateway.conftest import run_async, text
from tests.helpers import free_port, requires_postgres, wait_for

BASE = Path(__file__).resolve().parents[2]
pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


def database_url() -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def web_processes(upstream: Any) -> Iterator[list[int]]:
    env = {**os.environ, "DATABASE_URL": database_url(), "AIRLOCK_GATEWAY_WAIT_SECONDS": "0.5",
           "DB_CONN_MAX_AGE": "0", "PYTHONUNBUFFERED": "1"}
    wsgi, asgi = free_port(), free_port()
    procs = [
        subprocess.Popen([sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{wsgi}"],
                         cwd=BASE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                          "--port", str(asgi), "--log-level", "warning"],
                         cwd=BASE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    try:
        for port in (wsgi, asgi):
            wait_for(lambda port=port: listening(port), timeout=60, what=f"a web process on {port}")
        yield [wsgi, asgi]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)


class Alternating(httpx2.AsyncBaseTransport):
    """Sends each request to the next of the ports, in turn, as a load balancer might."""

    def __init__(self, ports: list[int]) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.ports = ports
        self.sent: list[tuple[int, str]] = []

    async def handle_async_request(self, request: Any) -> Any:
        port = self.ports[len(self.sent) % len(self.ports)]
        request.url = request.url.copy_with(port=port)
        self.sent.append((port, request.method))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_one_session_alternating_between_a_wsgi_and_an_asgi_process_is_one_run(
    web_processes: list[int], gw, upstream, token, rita: User
) -> None:
    transport = Alternating(web_processes)
    delete = ("web__delete_record", {"record_id": "beta"})

    async def session(decide: Any) -> Any:
        http = httpx2.AsyncClient(transport=transport, headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0))
        url = f"http://127.0.0.1:{web_processes[0]}/mcp/gw/"
        with anyio.fail_after(90):
            async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
                tools = [t.name for t in (await client.list_tools()).tools]
                read = await client.call_tool("web__lookup", {"record_id": "alpha"})
                held = await client.call_tool(*delete)
                await anyio.to_thread.run_sync(decide)
                done = [await client.call_tool(*delete) for _ in range(3)]
                return tools, read, held, done

    def decide() -> None:
        try:
            approval_decide(approval_id=Approval.objects.get(status="pending").pk, decision="approve", user=rita)
        finally:
            connection.close()  # this thread's own connection, or the test database stays in use

    tools, read, held, done = run_async(session, decide)
    assert "web__lookup" in tools and text(read) == "the first record"
    assert held.structured_content["airlock"]["status"] == "pending_approval"
    assert [text(r) for r in done] == ["deleted beta"] * 3
    assert len(upstream.calls("delete_record")) == 1
    # Both processes answered POSTs of the one session, and it is one run.
    assert {port for port, method in transport.sent if method == "POST"} == set(web_processes)
    session_row = GatewaySession.objects.get()
    assert Run.objects.count() == 1 and session_row.run == Run.objects.get()
