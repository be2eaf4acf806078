"""External agents' figures (`make bench` runs this after bench/run.py; it adds the
section "gateway" to bench/results.json and prints its lines with their targets):

Issue #48's table: every figure beside a floor measured in turns, in the same run, so a
slow or busy host moves both sides of each ratio.

1. **Gateway against the SDK-only proxy, in each era**: an allowed MCP call through
   `/mcp/<profile>/`, sequential, one client, against bench/sdk_proxy.py (a pass-through
   proxy made of the SDK's server and client the way the gateway is, with nothing of
   Airlock's) and the upstream called directly, the three sides alternating in rounds;
   once in the 2026-07-28 era (the SDK client's `auto`) and once in the handshake era
   (`legacy`: initialize, a session). Airlock's share is the gateway's p50 minus the
   proxy's (target <= 4 ms), and the gateway's throughput over the proxy's (target >=
   0.5). Both sides call the upstream's `lookup` read tool with a different record id
   each time (an identical call would be answered from the journal without reaching
   the upstream). Each round also samples the machine (`machine()`: a PostgreSQL round
   trip, a durable commit, a fixed piece of Python). Beside the p50s: the CPU a call
   costs the gateway's process and the proxy's, and the upstream's for each side's
   calls (`CpuMeter`), which the host's other tenants move less than a p50. After the
   2026-07-28 era's rounds, the database's part of a call (`database_part`): the same
   call made in the bench's own process as the gateway's database thread makes it,
   and the time it spends waiting on PostgreSQL (its three reads, two commit statements
   and COMMIT), the part of the share that no cut to Airlock's Python reaches.
2. **The decision API and a run's read against /healthz**, over one kept connection in
   alternating rounds: propose + report of an allowed client tool (two requests, two
   commits), p50 over /healthz's p50 (target <= 4x); an authenticated `GET
   /api/runs/<id>`, p50 over /healthz's (target <= 2.5x); beside them the web
   process's CPU for each, and the round trip's database part (`api_database_part`:
   the same requests handled in the bench's process by `config.wsgi`, and their waits
   on PostgreSQL).
3. **50 waiting clients**: 50 MCP clients at once, each with one call held for
   approval: the web process's RSS and PostgreSQL's connections while they wait, and the
   delay from each decision's commit to its client's answer (target: all within 1 s).
4. **Other servers' tools**: the gateway call of 1. with 500 MCP tools of another
   server registered (offered to other profiles), against the same call without them,
   alternating: their ratio (Airlock's own target, <= 1.1: a call reads its profile's
   tools, not the deployment's).
5. **Opening a stream**: the first call of a new client with a conversation key of its
   own (a new stream: its run is launched) against its second call, p50 of each over 20
   clients: their ratio (target <= 10).

The SDK's client speaks the 2026-07-28 era to the gateway (its default, `auto`), so
1., 3. and 5. are that era's; 3.'s clients are held over `input_required` rounds. Each
waiting client sends its own conversation key (`Airlock-Conversation`): one stream
takes one call at a time, as one agent would.

The web process is what a deployment runs (docs/deployment.md, "The web service"):
gunicorn with `config/gunicorn.py` (threaded workers over `config.wsgi`, the gateway
through agents/gateway/bridge.py), one process, on this machine's PostgreSQL; for the
50 waiting clients it has 64 threads, sized for them as that section says. The
upstream is examples/mcp_server.py. `python bench/gateway.py [CALLS] [uvicorn]` runs it
alone; `uvicorn` serves `config.asgi` instead, the other way to serve Airlock (the
figures the bench printed before this round were uvicorn's). The gateway is slower
behind gunicorn (the WSGI bridge; a waiting client is a thread): the waiting clients'
slowest answer measured 0.44-1.36 s there against 0.32-0.51 s under uvicorn
in the fifth round, 0.29-0.47 s and 0.25 s in the sixth (docs/gateway.md, "What a call
costs").
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# Issue #48's table: each figure against a floor measured in turns in the same run, so a
# slow host moves both sides (the absolute +5 ms, 0.5 of direct and 10 ms it replaced
# were met or missed with the machine a session got).
TARGET_SHARE_MS = 4.0  # the gateway's p50 minus the SDK-only proxy's, each era
TARGET_THROUGHPUT_OF_PROXY = 0.5  # the gateway's calls/s over the proxy's, each era
TARGET_ROUND_TRIP_OF_HEALTHZ = 4.0  # decision API propose + report p50 / /healthz p50
TARGET_RUN_READ_OF_HEALTHZ = 2.5  # an authenticated GET /api/runs/<id> p50 / /healthz p50
TARGET_DECISION_DELAY_S = 1.0
ERAS = {"2026-07-28": "auto", "handshake": "legacy"}  # the era, and the SDK client's mode that speaks it
# Airlock's own target, not the issue's: a call costs what its profile's tools cost.
TARGET_OTHER_TOOLS_RATIO = 1.1
TARGET_OPENING_RATIO = 10.0
OPENING_CLIENTS = 20
WAITING_CLIENTS = 50
NOTE_TOOL = {
    "name": "note", "description": "Writes a note in the client's own notebook.",
    "schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "risk": "read", "returns": "internal", "retry_safety": "safe",
}


def _cpu_seconds(pid: int) -> tuple[float, int]:
    """The CPU time process `pid` has used so far: its threads now alive, to the
    nanosecond (the scheduler's count, `/proc/<pid>/task/*/schedstat`; the clock-tick
    totals of `/proc/<pid>/stat` are 10 ms steps, as long as fifty `/healthz`), and in
    clock ticks the process's total less its live threads' (threads that ended, and the
    two counts' rounding)."""
    alive = alive_ticks = 0
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            alive += int((task / "schedstat").read_text().split()[0])
            alive_ticks += _ticks(task / "stat")
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile: the process's total has it
    return alive / 1e9, _ticks(pathlib.Path(f"/proc/{pid}/stat")) - alive_ticks


def _ticks(stat: pathlib.Path) -> int:
    # utime + stime (fields 14 and 15 of proc(5)'s stat, after the command's parentheses).
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


# The process's total and its threads' sum, each rounded on its own, drift apart by a few
# ticks between reads with no thread ending (0-4 measured on a busy process): a window's
# rise within this many is rounding, not threads that ended.
ROUNDING_TICKS = 5


class CpuMeter:
    """CPU time a few processes spend over the windows between `start()` and `stop()`,
    summed by name: what a call costs each of them, beside its wall time. A p50 moves
    with the host's other tenants; a process's own CPU a call moves less.

    Threads that ended within a window count too, in clock ticks: under uvicorn each
    request to a synchronous Django view runs on a thread of its own (asgiref's
    per-request executor) that ends with it, and those requests' CPU would otherwise
    not count at all."""

    def __init__(self, **pids: int) -> None:
        self.pids = pids
        self.used = dict.fromkeys(pids, 0.0)
        self._at: dict[str, tuple[float, int]] = {}

    def start(self) -> None:
        self._at = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> None:
        for name, pid in self.pids.items():
            (alive, rest), (alive_before, rest_before) = _cpu_seconds(pid), self._at[name]
            ended = rest - rest_before
            self.used[name] += alive - alive_before
            if ended > ROUNDING_TICKS:
                self.used[name] += ended / os.sysconf("SC_CLK_TCK")

    def per(self, count: int) -> dict[str, float]:
        """Milliseconds of CPU each process spent per one of `count` operations."""
        return {name: round(used * 1000 / max(count, 1), 3) for name, used in self.used.items()}


def _timed_calls(
    url: str, headers: dict[str, str], tool: str, n: int, offset: int = 0, warm: int = 5, mode: str = "auto",
    meter: CpuMeter | None = None,
) -> list[float]:
    """Seconds per call of `tool`, `n` sequential calls in one SDK connection (after
    `warm` unmeasured warm-up calls). `mode` is the SDK client's: `auto` speaks the
    2026-07-28 era where the server offers it, `legacy` the handshake era (a session).
    `meter` counts the CPU of the measured calls only."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def go() -> list[float]:
        took = []
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0))
        async with http, Client(streamable_http_client(url, http_client=http), cache=None,
                                mode=mode) as client:  # type: ignore[arg-type]
            for i in range(n + warm):
                if i == warm and meter is not None:
                    meter.start()
                start = time.perf_counter()
                result = await client.call_tool(tool, {"record_id": f"r{offset + i}"})
                elapsed = time.perf_counter() - start
                if result.is_error:
                    raise RuntimeError(f"{tool} failed: {result.content}")
                if i >= warm:
                    took.append(elapsed)
            if meter is not None and n:
                meter.stop()
        return took

    return anyio.run(go)


SERVERS = ("gunicorn", "uvicorn")


class Stand:
    """The upstream example server, its registration, a launcher's token and a web
    process (`server`: gunicorn over config.wsgi, or uvicorn over config.asgi) with the
    given environment."""

    def __init__(self, calls: int, server: str = "gunicorn") -> None:
        from bench.run import setup_django

        if server not in SERVERS:
            raise ValueError(f"server is one of {', '.join(SERVERS)}")
        self.server = server
        setup_django()
        from django.contrib.auth.models import Group, User
        from django.core.management import call_command
        from django.db import connection

        from agents.actions.tokens import token_create
        from agents.models import AgentProfile, McpServer

        with connection.cursor() as cur:
            cur.execute("truncate agents_run, agents_mcptool, agents_mcpserver, agents_gatewaysession "
                        "restart identity cascade")
        self.user, _ = User.objects.get_or_create(username="bench-gateway")
        self.user.groups.add(Group.objects.get(name="launcher"))
        self.reviewer, _ = User.objects.get_or_create(username="bench-reviewer")
        self.reviewer.groups.add(Group.objects.get(name="reviewer"))
        _token, self.token = token_create(user=self.user)
        self.upstream = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "mcp_server.py"), "--http", "--port", "0", "--max-seconds", "1800"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        )
        line = self.upstream.stdout.readline() if self.upstream.stdout else ""
        self.upstream_url = line.split()[1]
        self.proxy = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "sdk_proxy.py"), self.upstream_url],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        )
        line = self.proxy.stdout.readline() if self.proxy.stdout else ""
        self.proxy_url = line.split()[1]
        McpServer.objects.create(name="bench", transport="http", url=self.upstream_url)
        call_command("mcp_sync", "bench", verbosity=0)
        limits = {"max_steps": 10 * (calls + 10), "deadline_seconds": 3600}
        AgentProfile.objects.update_or_create(
            name="bench-gateway",
            defaults={"provider": "external", "tools": ["bench__lookup", "bench__delete_record"],
                      "client_tools": [NOTE_TOOL], "limits": limits},
        )

    @contextmanager
    def web(self, **env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
        from bench.workers import free_port, listening, wait_for

        port = free_port()
        if self.server == "gunicorn":
            # config/gunicorn.py as deployed, in one process: its RSS is the figure's.
            command = ["-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi:application"]
            env = {"WEB_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1", **env}
        else:
            command = ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
                       "--log-level", "warning"]
        proc = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, env={**os.environ, "LOG_LEVEL": "WARNING", **env},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: listening(port), what=f"the web process to listen on {port}")
            yield f"http://127.0.0.1:{port}", proc
        finally:
            proc.terminate()
            proc.wait(timeout=20)

    def close(self) -> None:
        for proc in (self.proxy, self.upstream):
            proc.terminate()
            proc.wait(timeout=20)


# A fixed piece of pure-Python work (JSON in and out, as every request does): the
# machine's speed for the interpreter, beside its database's in `machine()`.
_REFERENCE = {"run": 1, "calls": [{"tool": "lookup", "args": {"record_id": f"r{i}"}, "ok": True} for i in range(40)]}


def machine(samples: int = 200) -> dict[str, float]:
    """This machine's speed right now, for reading the figures against another run's
    (the same code measured 2x apart between sessions on this shared machine): a
    PostgreSQL round trip (`SELECT 1`), a durable commit (one-row INSERT, autocommit)
    and the fixed Python work `_REFERENCE`, p50 of `samples` each."""
    import psycopg

    def p50(fn: Any) -> float:
        took = []
        for _ in range(samples):
            start = time.perf_counter()
            fn()
            took.append(time.perf_counter() - start)
        return statistics.median(took)

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        # A table of its own, not a temporary one: those skip the WAL, so their commit
        # is not durable.
        conn.execute("create table if not exists bench_machine (body text)")
        found = {
            "db_round_trip_us": p50(lambda: conn.execute("select 1").fetchall()) * 1e6,
            "db_commit_us": p50(lambda: conn.execute("insert into bench_machine values ('x')")) * 1e6,
        }
        conn.execute("drop table bench_machine")
    found["python_reference_us"] = p50(lambda: [json.loads(json.dumps(_REFERENCE)) for _ in range(20)]) * 1e6
    return found


def gateway_vs_direct(stand: Stand, base: str, n: int, mode: str = "auto", pid: int | None = None) -> dict[str, Any]:
    """The figure as a dict: p50s in ms, calls per second, added p50, throughput ratio;
    the same for the SDK-only proxy under `sdk_proxy`; Airlock's share (the gateway's
    p50 over the proxy's) and the gateway's throughput over the proxy's. The sides
    alternate in rounds, so a change in the machine's load meets them all. `mode` is
    the SDK client's (`ERAS`): the proxy and the gateway are spoken to in the same era.
    With `pid`, the web process's: the CPU a call costs the gateway's process and the
    proxy's, and the upstream's for each."""
    direct: list[float] = []
    through: list[float] = []
    proxied: list[float] = []
    speeds: list[dict[str, float]] = []
    rounds = 4
    by_proxy = CpuMeter(server=stand.proxy.pid, upstream=stand.upstream.pid)
    by_gateway = CpuMeter(server=pid, upstream=stand.upstream.pid) if pid is not None else None
    # Each era's calls take record ids of their own: an identical call in one stream
    # would be answered from the journal without reaching the upstream.
    base_offset = 0 if mode == "auto" else 30_000_000
    for r in range(rounds):
        offset = base_offset + r * n
        speeds.append(machine())
        direct += _timed_calls(stand.upstream_url, {}, "lookup", n // rounds, offset=offset, mode=mode)
        proxied += _timed_calls(stand.proxy_url, {}, "bench__lookup", n // rounds, offset=offset, mode=mode,
                                meter=by_proxy)
        through += _timed_calls(f"{base}/mcp/bench-gateway/", {"Authorization": f"Bearer {stand.token}"},
                                "bench__lookup", n // rounds, offset=offset, mode=mode, meter=by_gateway)
    direct_p50, through_p50 = statistics.median(direct) * 1000, statistics.median(through) * 1000
    proxy_p50 = statistics.median(proxied) * 1000
    return {
        "mode": mode,
        "machine": {key: round(statistics.median(s[key] for s in speeds), 1) for key in speeds[0]},
        "sdk_proxy": {
            "p50_ms": round(proxy_p50, 2),
            "added_p50_ms": round(proxy_p50 - direct_p50, 2),
            "calls_per_s": round(len(proxied) / sum(proxied), 1),
            "throughput_ratio": round(sum(direct) / sum(proxied), 3),
        },
        "calls": len(direct),
        "direct_p50_ms": round(direct_p50, 2),
        "gateway_p50_ms": round(through_p50, 2),
        "added_p50_ms": round(through_p50 - direct_p50, 2),
        "airlock_share_ms": round(through_p50 - proxy_p50, 2),
        "direct_calls_per_s": round(len(direct) / sum(direct), 1),
        "gateway_calls_per_s": round(len(through) / sum(through), 1),
        "throughput_ratio": round(sum(direct) / sum(through), 3),
        "throughput_of_proxy": round(sum(proxied) / sum(through), 3),
        # CPU ms a call: each side's own process, and the upstream's for that side's calls.
        "cpu_ms_per_call": None if by_gateway is None else {
            "gateway": by_gateway.per(len(through))["server"], "proxy": by_proxy.per(len(proxied))["server"],
            "upstream_from_gateway": by_gateway.per(len(through))["upstream"],
            "upstream_from_proxy": by_proxy.per(len(proxied))["upstream"],
        },
    }


@contextmanager
def _database_waits() -> Iterator[list[float]]:
    """The wall seconds of each of this thread's waits on PostgreSQL while the block runs:
    psycopg's `Connection.wait`, where every statement, pipeline and COMMIT sends its
    messages and reads the answer (the round trip, the server's work, a commit's flush)."""
    import psycopg

    waits: list[float] = []
    me = threading.get_ident()
    original = psycopg.Connection.wait

    def timed(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != me:
            return original(self, gen, *args, **kwargs)
        start = time.perf_counter()
        try:
            return original(self, gen, *args, **kwargs)
        finally:
            waits.append(time.perf_counter() - start)

    psycopg.Connection.wait = timed  # type: ignore[method-assign]
    try:
        yield waits
    finally:
        psycopg.Connection.wait = original  # type: ignore[method-assign]


def _waited(work: Callable[[int], None], n: int) -> dict[str, Any]:
    """`work(i)` for each of `n` i's, after five unmeasured ones (negative i's): the p50s
    of each one's wall time, of this thread's CPU, and of its waits on PostgreSQL
    (`_database_waits`: their sum, and how many)."""
    for i in range(5):
        work(-1 - i)
    walls: list[float] = []
    cpus: list[float] = []
    waited: list[float] = []
    counts: list[int] = []
    for i in range(n):
        with _database_waits() as waits:
            start, cpu = time.perf_counter(), time.thread_time()
            work(i)
            walls.append(time.perf_counter() - start)
            cpus.append(time.thread_time() - cpu)
        waited.append(sum(waits))
        counts.append(len(waits))
    return {
        "p50_ms": round(statistics.median(walls) * 1000, 2),
        "thread_cpu_ms": round(statistics.median(cpus) * 1000, 2),
        "database_waits_ms": round(statistics.median(waited) * 1000, 2),
        "waits": statistics.median(counts),
    }


def database_part(stand: Stand, n: int, offset: int = 40_000_000) -> dict[str, Any]:
    """The database's part of a gateway call, which no Python cut reaches: `n` calls made
    in this process as the gateway's database thread makes them (`core.admit_and_start`
    of the same `lookup` call, same token and stream, the upstream called through the
    same pooled MCP session), each timed whole, in this thread's CPU, and in its waits on
    PostgreSQL (`_waited`)."""
    from django.utils import timezone

    from agents.gateway import core
    from agents.runs import driver
    from agents.tools.mcp.client import POOL

    header = f"Bearer {stand.token}"

    def call(i: int) -> None:
        _admitted, started = core.admit_and_start(
            header, "bench-gateway", sid=None, run_header=None, tool="bench__lookup",
            args={"record_id": f"r{offset + i}"}, modern=True, arrived=timezone.now(),
        )
        driver.release_connection()  # as the gateway's database thread does after each request
        if not isinstance(started, tuple) or started[0].status != "succeeded":
            raise RuntimeError(f"the in-process call did not succeed: {started}")

    try:
        return {"calls": n, **_waited(call, n)}
    finally:
        POOL.close()  # before the upstream stops: the session ends now, not at exit


def api_database_part(stand: Stand, n: int) -> dict[str, Any]:
    """The database's part of the decision API's propose + report: `n` round trips of
    `api_vs_healthz`'s (the allowed client tool `note`) handled in the bench's process by
    the WSGI application gunicorn serves (`config.wsgi`, the token's door), each timed
    whole and in its waits on PostgreSQL (`_waited`)."""
    import io

    from bench.serve import wsgi_call
    from config.wsgi import application

    def request(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        status, _headers, answer = wsgi_call(application, {
            "REQUEST_METHOD": method, "PATH_INFO": path, "HTTP_HOST": "127.0.0.1", "SERVER_NAME": "127.0.0.1",
            "HTTP_AUTHORIZATION": f"Bearer {stand.token}", "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(data)), "wsgi.input": io.BytesIO(data),
        })
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: {status} {answer[:300]!r}")
        return cast(dict[str, Any], json.loads(answer))

    run_id = request("POST", "/api/runs", {"agent": "bench-gateway", "task": "bench: the API's database part"})["id"]

    def round_trip(i: int) -> None:
        proposed = request("POST", f"/api/runs/{run_id}/calls", {"tool": "note", "args": {"text": f"d{i}"}})
        if proposed["status"] != "approved":
            raise RuntimeError(f"note was not allowed: {proposed}")
        request("POST", f"/api/runs/{run_id}/calls/{proposed['key']}/result", {"ok": True, "output": f"noted {i}"})

    return {"round_trips": n, **_waited(round_trip, n)}


OTHER_TOOLS = 500


def other_servers_tools(stand: Stand, base: str, n: int, tools: int = OTHER_TOOLS) -> dict[str, Any]:
    """The gateway call of `gateway_vs_direct` with `tools` more MCP tools registered on
    another server (offered to other profiles, not this one) against the same call
    without them, in alternating rounds: a call should cost the same however many
    tools the rest of the deployment has."""
    from agents.models import McpServer, McpTool

    other, _ = McpServer.objects.get_or_create(name="others", defaults={"transport": "http",
                                                                         "url": "http://127.0.0.1:9/mcp"})
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "a parameter"}
                                               for i in range(12)}}
    url, headers = f"{base}/mcp/bench-gateway/", {"Authorization": f"Bearer {stand.token}"}
    without: list[float] = []
    with_them: list[float] = []
    rounds = 4
    try:
        for r in range(rounds):
            McpTool.objects.filter(server=other).delete()
            without += _timed_calls(url, headers, "bench__lookup", n // rounds, offset=50_000_000 + r * n)
            McpTool.objects.bulk_create([
                McpTool(server=other, mcp_name=f"t{i}", name=f"others__t{i}", description="Does a thing. " * 20,
                        input_schema=schema, sha256="0" * 64)
                for i in range(tools)
            ])
            with_them += _timed_calls(url, headers, "bench__lookup", n // rounds, offset=60_000_000 + r * n)
    finally:
        other.delete()
    alone, among = statistics.median(without) * 1000, statistics.median(with_them) * 1000
    return {"tools": tools, "calls": len(without), "alone_p50_ms": round(alone, 2),
            "among_p50_ms": round(among, 2), "ratio": round(among / alone, 3)}


def api_vs_healthz(stand: Stand, base: str, n: int, pid: int | None = None) -> dict[str, Any]:
    """Over one kept HTTP connection, in alternating rounds: `GET /healthz` (the floor:
    the web server and Django's handler, no database), the decision API's propose +
    report of the allowed client tool `note` (two requests, two commits), and an
    authenticated `GET /api/runs/<id>` of that run; `n` of each (after a few unmeasured
    ones). Their p50s, each half of the round trip, and the ratios to /healthz; with
    `pid` (the web process's), the CPU each costs it."""
    import httpx2

    headers = {"Authorization": f"Bearer {stand.token}"}
    took: list[float] = []
    proposes: list[float] = []
    reports: list[float] = []
    reads: list[float] = []
    healthz: list[float] = []
    rounds = 4
    meters = {kind: CpuMeter(server=pid) for kind in ("healthz", "round_trip", "run_read")} if pid is not None else {}

    @contextmanager
    def metered(kind: str) -> Iterator[None]:
        meter = meters.get(kind)
        if meter is not None:
            meter.start()
        yield
        if meter is not None:
            meter.stop()

    with httpx2.Client(base_url=base, headers=headers, timeout=30.0) as http:
        run = http.post("/api/runs", json={"agent": "bench-gateway", "task": "bench: decision API round trips"})
        run.raise_for_status()
        run_id = run.json()["id"]

        def round_trip(i: int) -> None:
            start = time.perf_counter()
            proposed = http.post(f"/api/runs/{run_id}/calls", json={"tool": "note", "args": {"text": f"n{i}"}})
            middle = time.perf_counter()
            if proposed.status_code != 200 or proposed.json()["status"] != "approved":
                raise RuntimeError(f"note was not allowed: {proposed.status_code} {proposed.text[:300]}")
            key = proposed.json()["key"]
            reported = http.post(f"/api/runs/{run_id}/calls/{key}/result", json={"ok": True, "output": f"noted {i}"})
            end = time.perf_counter()
            if reported.status_code != 200 or reported.json()["status"] != "succeeded":
                raise RuntimeError(f"the report was refused: {reported.status_code} {reported.text[:300]}")
            took.append(end - start)
            proposes.append(middle - start)
            reports.append(end - middle)

        def timed_get(path: str, into: list[float]) -> None:
            start = time.perf_counter()
            answer = http.get(path)
            into.append(time.perf_counter() - start)
            if answer.status_code != 200:
                raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:300]}")

        warm: list[float] = []
        for i in range(5):
            round_trip(-1 - i)
            timed_get("/healthz", warm)
            timed_get(f"/api/runs/{run_id}", warm)
        del took[:], proposes[:], reports[:]
        per = max(1, n // rounds)
        for r in range(rounds):
            with metered("healthz"):
                for _ in range(per):
                    timed_get("/healthz", healthz)
            with metered("round_trip"):
                for i in range(per):
                    round_trip(r * per + i)
            with metered("run_read"):
                for _ in range(per):
                    timed_get(f"/api/runs/{run_id}", reads)
    healthz_p50 = statistics.median(healthz) * 1000
    trip_p50, read_p50 = statistics.median(took) * 1000, statistics.median(reads) * 1000
    return {
        "round_trips": len(took),
        "healthz_p50_ms": round(healthz_p50, 3),
        "p50_ms": round(trip_p50, 2),
        "propose_p50_ms": round(statistics.median(proposes) * 1000, 2),
        "report_p50_ms": round(statistics.median(reports) * 1000, 2),
        "of_healthz": round(trip_p50 / healthz_p50, 2),
        "run_read_p50_ms": round(read_p50, 2),
        "run_read_of_healthz": round(read_p50 / healthz_p50, 2),
        # The web process's CPU ms for each: a /healthz, a propose + report, a run read.
        "cpu_ms": {kind: meter.per(per * rounds)["server"] for kind, meter in meters.items()} or None,
    }


def _serving_pid(proc: subprocess.Popen[bytes]) -> int:
    """The process that answers requests: gunicorn's one worker (the arbiter only
    forks it), or uvicorn itself."""
    children = pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(children[0]) if children else proc.pid


def _rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _database_connections() -> int:
    """Connections to this database other than the bench's own."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("select count(*) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()")
        return int(cur.fetchone()[0])


def waiting_clients(stand: Stand, base: str, proc: subprocess.Popen[bytes], clients: int) -> dict[str, Any]:
    """`clients` MCP clients at once (a stream each), each calling `bench__delete_record` (irreversible:
    held for a reviewer), on a web process that waits up to 60 s for decisions. Once all
    are pending: the process's RSS and the database's connections; then each approval is
    decided in turn, and each client's answer is timed from its decision's commit."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from agents.actions.approvals import approval_decide
    from agents.models import Approval

    url = f"{base}/mcp/bench-gateway/"
    answered: dict[str, float] = {}
    texts: dict[str, str] = {}
    # One unmeasured session first: imports and first requests, so RSS "before" is warm.
    _timed_calls(url, {"Authorization": f"Bearer {stand.token}"}, "bench__lookup", 3, offset=10_000_000)
    pid = _serving_pid(proc) if stand.server == "gunicorn" else proc.pid
    rss_before = _rss_bytes(pid)

    async def one(i: int) -> None:
        headers = {"Authorization": f"Bearer {stand.token}", "Airlock-Conversation": f"waiting-{i}-{time.time()}"}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(90.0))
        async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
            result = await client.call_tool("bench__delete_record", {"record_id": f"c{i}"})
            answered[f"c{i}"] = time.monotonic()
            texts[f"c{i}"] = "".join(getattr(b, "text", "") for b in result.content)

    async def all_clients() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(one, i)

    thread = threading.Thread(target=anyio.run, args=(all_clients,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while Approval.objects.filter(status="pending").count() < clients:
        if time.monotonic() > deadline:
            raise RuntimeError("the clients' calls did not all reach the queue")
        time.sleep(0.2)
    time.sleep(1.0)  # all are in their wait loops now
    rss_waiting = _rss_bytes(pid)
    connections_waiting = _database_connections()
    decided: dict[str, float] = {}
    for approval in Approval.objects.filter(status="pending").order_by("pk"):
        approval_decide(approval_id=approval.pk, decision="approve", user=stand.reviewer)
        decided[approval.args["record_id"]] = time.monotonic()  # committed: approval_decide returned
    thread.join(timeout=120)
    delays = sorted(answered[k] - decided[k] for k in decided if k in answered)
    ran = sum(1 for k in decided if texts.get(k, "").startswith("deleted "))
    return {
        "clients": clients,
        "answered": len(delays),
        "ran_upstream": ran,
        "rss_before_bytes": rss_before,
        "rss_waiting_bytes": rss_waiting,
        "rss_per_waiting_client_bytes": round((rss_waiting - rss_before) / clients),
        "database_connections_waiting": connections_waiting,
        "decision_delay_p50_s": round(statistics.median(delays), 3) if delays else None,
        "decision_delay_max_s": round(delays[-1], 3) if delays else None,
    }


def stream_opening(stand: Stand, base: str, clients: int = OPENING_CLIENTS) -> dict[str, Any]:
    """Each of `clients` new clients, with a conversation key of its own, times its
    first call (the stream's run is launched) and its second; p50s and their ratio."""
    first: list[float] = []
    second: list[float] = []
    for i in range(clients):
        headers = {"Authorization": f"Bearer {stand.token}", "Airlock-Conversation": f"opening-{i}-{time.time()}"}
        took = _timed_calls(f"{base}/mcp/bench-gateway/", headers, "bench__lookup", 2, offset=20_000_000 + 2 * i,
                            warm=0)
        first.append(took[0])
        second.append(took[1])
    first_p50, second_p50 = statistics.median(first) * 1000, statistics.median(second) * 1000
    return {"clients": clients, "first_p50_ms": round(first_p50, 2), "second_p50_ms": round(second_p50, 2),
            "ratio": round(first_p50 / second_p50, 2)}


def gateway_bench(
    calls: int = 200, round_trips: int = 200, clients: int = WAITING_CLIENTS, server: str = "gunicorn"
) -> dict[str, Any]:
    # BENCH_GATEWAY_PARTS (comma-separated: gateway, handshake, api, others, opening,
    # waiting; all by default) runs some of the sections, for measuring one cut. The
    # gateway's and the API's sections include their database parts.
    parts = set(os.environ.get("BENCH_GATEWAY_PARTS", "gateway,handshake,api,others,opening,waiting").split(","))
    stand = Stand(calls + round_trips, server)
    results: dict[str, Any] = {"server": server}
    try:
        with stand.web() as (base, proc):
            pid = _serving_pid(proc)
            if "gateway" in parts:
                results["gateway"] = gateway_vs_direct(stand, base, calls, pid=pid)
                results["database_part"] = database_part(stand, calls)
            if "handshake" in parts:
                results["gateway_handshake"] = gateway_vs_direct(stand, base, calls, mode=ERAS["handshake"], pid=pid)
            if "api" in parts:
                results["decision_api"] = api_vs_healthz(stand, base, round_trips, pid=pid)
                results["decision_api"]["database_part"] = api_database_part(stand, round_trips)
            if "others" in parts:
                results["other_tools"] = other_servers_tools(stand, base, calls // 2)
            if "opening" in parts:
                results["opening"] = stream_opening(stand, base)
        if "waiting" in parts:
            # Each waiting client holds one of gunicorn's threads: as many as deployment.md says to size for.
            threads = str(max(32, 2 * clients))
            with stand.web(AIRLOCK_GATEWAY_WAIT_SECONDS="60", WEB_THREADS=threads) as (base, proc):
                results["waiting"] = waiting_clients(stand, base, proc, clients)
    finally:
        stand.close()
    return results


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    from bench.run import Targets

    t = Targets()
    for era, key in (("2026-07-28", "gateway"), ("handshake", "gateway_handshake")):
        if key not in r:
            continue
        g = r[key]
        t.check(f"gateway {era} era: Airlock's share ms (p50 - SDK proxy's p50)", g["airlock_share_ms"], "<=",
                TARGET_SHARE_MS)
        t.check(f"gateway {era} era: throughput / SDK proxy's (sequential)", g["throughput_of_proxy"], ">=",
                TARGET_THROUGHPUT_OF_PROXY)
    if (d := r.get("decision_api")) is not None:
        t.check("decision API: propose + report p50 / /healthz p50", d["of_healthz"], "<=",
                TARGET_ROUND_TRIP_OF_HEALTHZ)
        t.check("GET /api/runs/<id> (token) p50 / /healthz p50", d["run_read_of_healthz"], "<=",
                TARGET_RUN_READ_OF_HEALTHZ)
    if (o := r.get("other_tools")) is not None:
        t.check(f"gateway: call p50 with {o['tools']} other servers' tools / without", o["ratio"], "<=",
                TARGET_OTHER_TOOLS_RATIO)
    if (op := r.get("opening")) is not None:
        t.check("gateway: a new stream's first call p50 / its second's", op["ratio"], "<=", TARGET_OPENING_RATIO)
    w = r.get("waiting")
    if w is not None and w["decision_delay_max_s"] is not None:
        t.check(f"gateway: {w['clients']} waiting clients, slowest decision-to-answer s", w["decision_delay_max_s"],
                "<=", TARGET_DECISION_DELAY_S)
    return t.rows


def print_gateway(r: dict[str, Any]) -> None:
    d, w, o, op = r.get("decision_api"), r.get("waiting"), r.get("other_tools"), r.get("opening")
    mb = 1024 * 1024
    print(f"\n[{r.get('server', 'uvicorn')}] load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for era, key in (("2026-07-28", "gateway"), ("handshake", "gateway_handshake")):
        g = r.get(key)
        if g is None:
            continue
        f, m = g["sdk_proxy"], g["machine"]
        print(
            f"gateway, {era} era ({g['calls']} calls each side, alternating): direct p50 {g['direct_p50_ms']:.1f} ms, "
            f"SDK proxy {f['p50_ms']:.1f} ms, through the gateway {g['gateway_p50_ms']:.1f} ms; Airlock's share "
            f"{g['airlock_share_ms']:+.1f} ms (target <= {TARGET_SHARE_MS:g}); throughput {g['gateway_calls_per_s']:.0f}/s"
            f" vs the proxy's {f['calls_per_s']:.0f}/s = {g['throughput_of_proxy']:.2f} (target >= "
            f"{TARGET_THROUGHPUT_OF_PROXY:g}); direct {g['direct_calls_per_s']:.0f}/s"
        )
        print(
            f"  the machine in the same rounds: PostgreSQL round trip {m['db_round_trip_us']:.0f} us, durable commit "
            f"{m['db_commit_us']:.0f} us, fixed Python work {m['python_reference_us']:.0f} us; a call's two durable "
            f"commits (its intent before the upstream, its result before the answer) alone: "
            f"{2 * m['db_commit_us'] / 1000:.1f} ms of the share"
        )
        if (c := g.get("cpu_ms_per_call")) is not None:
            print(
            f"  CPU a call: the gateway's process {c['gateway']:.2f} ms against the proxy's {c['proxy']:.2f} ms "
            f"(+{c['gateway'] - c['proxy']:.2f} ms); the upstream's {c['upstream_from_gateway']:.2f} ms for the "
            f"gateway's calls, {c['upstream_from_proxy']:.2f} ms for the proxy's"
        )
        if key == "gateway" and (p := r.get("database_part")) is not None:
            print(
            f"  the database's part ({p['calls']} calls made in the bench's process as the gateway's database "
            f"thread makes them): {p['database_waits_ms']:.2f} ms a call waiting on PostgreSQL ({p['waits']:g} "
            f"waits), against the share's target of {TARGET_SHARE_MS:g} ms; that thread's CPU "
            f"{p['thread_cpu_ms']:.2f} ms, the call {p['p50_ms']:.1f} ms with the upstream's"
        )
    if d is not None:
        print(
        f"decision API ({d['round_trips']} round trips, alternating with /healthz): propose + report p50 "
        f"{d['p50_ms']:.1f} ms (propose {d['propose_p50_ms']:.1f}, report {d['report_p50_ms']:.1f}) against /healthz "
        f"{d['healthz_p50_ms']:.2f} ms = {d['of_healthz']:.1f}x (target <= {TARGET_ROUND_TRIP_OF_HEALTHZ:g}x)"
    )
        print(
        f"GET /api/runs/<id> with a token: p50 {d['run_read_p50_ms']:.2f} ms against /healthz "
        f"{d['healthz_p50_ms']:.2f} ms = {d['run_read_of_healthz']:.1f}x (target <= {TARGET_RUN_READ_OF_HEALTHZ:g}x)"
    )
        if (c := d.get("cpu_ms")) is not None:
            print(
            f"  the web process's CPU: /healthz {c['healthz']:.2f} ms, propose + report {c['round_trip']:.2f} ms "
            f"({c['round_trip'] / c['healthz']:.1f}x), run read {c['run_read']:.2f} ms ({c['run_read'] / c['healthz']:.1f}x)"
        )
        if (p := d.get("database_part")) is not None:
            print(
            f"  the database's part ({p['round_trips']} round trips handled in the bench's process by config.wsgi): "
            f"{p['database_waits_ms']:.2f} ms waiting on PostgreSQL ({p['waits']:g} waits) of {p['p50_ms']:.1f} ms, "
            f"against the target's {TARGET_ROUND_TRIP_OF_HEALTHZ:g} x /healthz = "
            f"{TARGET_ROUND_TRIP_OF_HEALTHZ * d['healthz_p50_ms']:.1f} ms for the whole round trip"
        )
    if o is not None:
        print(
        f"a gateway call with {o['tools']} other servers' MCP tools registered: p50 {o['among_p50_ms']:.1f} ms "
        f"against {o['alone_p50_ms']:.1f} ms without them ({o['ratio']:.2f}x; {o['calls']} calls each)"
    )
    if op is not None:
        print(
        f"opening a stream ({op['clients']} new clients, a conversation key each): first call p50 "
        f"{op['first_p50_ms']:.1f} ms, second {op['second_p50_ms']:.1f} ms ({op['ratio']:.1f}x)"
    )
    if w is not None:
        delay = "n/a" if w["decision_delay_p50_s"] is None else (
        f"p50 {w['decision_delay_p50_s'] * 1000:.0f} ms, max {w['decision_delay_max_s'] * 1000:.0f} ms")
        print(
        f"{w['clients']} waiting gateway clients: RSS {w['rss_before_bytes'] / mb:.0f} MB before, "
        f"{w['rss_waiting_bytes'] / mb:.0f} MB while waiting ({w['rss_per_waiting_client_bytes'] / 1024:.0f} kB a "
        f"client); {w['database_connections_waiting']} database connections while waiting; decision to answer "
        f"{delay}; {w['answered']} answered, upstream ran {w['ran_upstream']}"
    )
    for x in r.get("targets", []):
        print(f"  {'met   ' if x['met'] else 'MISSED'} {x['target']:<70} measured {x['value']:g}")


def main() -> None:
    from bench.run import environment

    environment()  # what the bench runs with, before anything reads it (not on import)
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    server = sys.argv[2] if len(sys.argv) > 2 else "gunicorn"
    found = gateway_bench(calls=calls, round_trips=calls, server=server)
    found["targets"] = targets(found)
    out = ROOT / "bench" / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["gateway"] = found
    out.write_text(json.dumps(results, indent=2))
    print_gateway(found)


if __name__ == "__main__":
    main()
