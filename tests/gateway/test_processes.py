"""The gateway in real web processes on the test database. Sessions live in the
database: one MCP session whose requests alternate between two web processes, one
serving `config.wsgi` (runserver, threaded) and one `config.asgi` (uvicorn), goes on as
one session and one run. A process killed mid-call: the run recovers as runs do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from django.contrib.auth.models import User
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agents.actions.approvals import approval_decide
from agents.models import Approval, GatewayStream, McpTool, Run, ToolCall
from tests.gateway.conftest import modern_rpc, run_async, text
from tests.helpers import database_url, free_port, listening, requires_postgres, wait_for

BASE = Path(__file__).resolve().parents[2]
pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


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
                done = [await client.call_tool(*delete) for _ in range(2)]
                return tools, read, held, done

    def decide() -> None:
        try:
            approval_decide(approval_id=Approval.objects.get(status="pending").pk, decision="approve", user=rita)
        finally:
            connection.close()  # this thread's own connection, or the test database stays in use

    tools, read, held, done = run_async(session, decide)
    assert "web__lookup" in tools and text(read) == "the first record"
    assert held.structured_content["airlock"]["status"] == "pending_approval"
    assert text(done[0]) == "deleted beta"
    assert done[1].structured_content["airlock"]["status"] == "pending_approval"  # delivered once: a new intent
    assert len(upstream.calls("delete_record")) == 1
    # Both processes answered POSTs of the one client, and it is one run: the stream's.
    assert {port for port, method in transport.sent if method == "POST"} == set(web_processes)
    assert Run.objects.count() == 1 and GatewayStream.objects.get().run == Run.objects.get()


@pytest.fixture
def gateway_process(upstream: Any) -> Iterator[Any]:
    """Start (and stop) uvicorn processes serving `config.asgi` on the test database,
    with a 2-second lease, so a killed process's run is free again soon."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**settings: str) -> tuple[subprocess.Popen[bytes], int]:
        env = {**os.environ, "DATABASE_URL": database_url(), "AIRLOCK_GATEWAY_WAIT_SECONDS": "30",
               "AIRLOCK_GATEWAY_HOLD_SECONDS": "20",
               "AIRLOCK_LEASE_SECONDS": "2", "DB_CONN_MAX_AGE": "0", "PYTHONUNBUFFERED": "1", **settings}
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                cwd=BASE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        wait_for(lambda: listening(port), timeout=60, what=f"a web process on {port}")
        return proc, port

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)


def call_once(port: int, token: str, tool: str, args: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """One tools/call in a new MCP session: its result, or the exception it raised."""

    async def go() -> Any:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", **(headers or {})},
                                  timeout=httpx2.Timeout(60.0))
        with anyio.fail_after(90):
            async with http, Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp/gw/", http_client=http),
                                    cache=None) as client:
                return await client.call_tool(tool, args)

    try:
        return run_async(go)
    except Exception as exc:  # noqa: BLE001 - what the client got is the point
        return exc


@pytest.mark.parametrize("retry", ["unsafe", "safe"])
def test_a_gateway_process_killed_mid_call_recovers_as_runs_do(
    gateway_process: Any, gw, upstream, token, retry: str
) -> None:
    """The process serving the gateway is SIGKILLed while the upstream runs the call.
    The intent row stays `started`; the client's retry (in a new session continuing
    the run, on another process) resumes the run as a worker would: an unsafe call is
    held as "outcome unknown" and not sent again, a safe one is sent again under the
    same idempotency key and answers."""
    McpTool.objects.filter(name="web__slow").update(retry_safety_override=retry)
    first, port = gateway_process()
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(got=call_once(port, token, "web__slow", {"seconds": 3})))
    thread.start()
    wait_for(lambda: len(upstream.calls("slow")) == 1, timeout=60, what="the upstream running the call")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=20)
    thread.join(timeout=60)
    got = box["got"]
    assert isinstance(got, Exception) or got.is_error, f"the client was answered by a dead process: {got!r}"

    run = Run.objects.get()
    intent = ToolCall.objects.get(run=run)
    # The intent row: written with the move into `acting`; an unsafe call marks it
    # `started` before it is sent (a safe one may simply be sent again).
    assert intent.tool == "web__slow" and run.state == "acting"
    assert intent.status == ("started" if retry == "unsafe" else "intended")

    _second, port = gateway_process()
    again = call_once(port, token, "web__slow", {"seconds": 3}, headers={"Airlock-Run": str(run.pk)})
    assert not isinstance(again, Exception), again
    run.refresh_from_db()
    slow_calls = upstream.calls("slow")
    if retry == "unsafe":
        assert again.structured_content["airlock"]["status"] == "pending_approval"
        approval = Approval.objects.get(run=run, status="pending")
        assert approval.kind == "outcome_unknown" and "web__slow was interrupted" in approval.reason
        assert run.state == "awaiting_approval"
        assert len(slow_calls) == 1, "an unsafe call whose outcome is unknown is not sent again"
        assert ToolCall.objects.get(run=run).status == "started"
    else:
        assert not again.is_error and text(again) == "slept 3.0 s"
        assert len(slow_calls) == 2 and slow_calls[0]["idempotency_key"] == slow_calls[1]["idempotency_key"]
        assert slow_calls[0]["idempotency_key"] == intent.idempotency_key
        entry = ToolCall.objects.get(run=run)
        assert entry.status == "succeeded" and run.state == "planning"
        assert not Approval.objects.filter(run=run).exists()


def test_a_held_calls_request_state_outlives_the_process_that_sealed_it(
    gateway_process: Any, gw, upstream, token, rita: User
) -> None:
    """2026-07-28: a held call's `requestState` is sealed under a key derived from
    SECRET_KEY, so another process (or host) accepts it: the process that answered
    `input_required` is killed, the call is approved, and the client's next round, sent
    to a new process with the same state, gets the call's result."""
    delete = ("web__delete_record", {"record_id": "omega"})
    first, port = gateway_process(AIRLOCK_GATEWAY_WAIT_SECONDS="0.5")

    def round_on(port: int, state: str | None) -> Any:
        async def go() -> Any:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
            with anyio.fail_after(60):
                async with http, Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp/gw/", http_client=http),
                                        cache=None) as client:
                    return await client.session.call_tool(*delete, request_state=state, allow_input_required=True)

        return run_async(go)

    held = round_on(port, None)
    assert held.result_type == "input_required" and held.request_state
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=20)
    approval_decide(approval_id=Approval.objects.get(status="pending").pk, decision="approve", user=rita)
    _second, port = gateway_process(AIRLOCK_GATEWAY_WAIT_SECONDS="5")
    done = round_on(port, held.request_state)
    assert not done.is_error and text(done) == "deleted omega"
    assert len(upstream.calls("delete_record")) == 1


def test_a_tasks_outcome_is_delivered_after_the_process_that_created_it_is_killed(
    gateway_process: Any, gw, upstream, token, rita: User
) -> None:
    """2026-07-28 with the tasks extension: the task is a row written before its handle
    goes out, so when the process that created it is killed, a poll that lands on a
    new process finds it, runs the approved call once and answers its outcome."""
    delete = {"name": "web__delete_record", "arguments": {"record_id": "sigma"}}
    first, port = gateway_process(AIRLOCK_GATEWAY_WAIT_SECONDS="0.5")
    handle = modern_rpc(f"http://127.0.0.1:{port}/mcp/gw/", token, "tools/call", delete)["result"]
    assert (handle["resultType"], handle["status"]) == ("task", "working")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=20)
    approval_decide(approval_id=Approval.objects.get(status="pending").pk, decision="approve", user=rita)
    _second, port = gateway_process(AIRLOCK_GATEWAY_WAIT_SECONDS="0.5")
    done = modern_rpc(f"http://127.0.0.1:{port}/mcp/gw/", token, "tasks/get", {"taskId": handle["taskId"]})["result"]
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "deleted sigma"
    assert len(upstream.calls("delete_record")) == 1
