"""Sections 4, 5 and 6 of `make bench`: real Celery workers on Redis.

Sections 4 and 5 use `celery worker --pool solo` processes (one process each, so a
worker's memory is one number); the approval latency goes through a real HTTP server.
Section 6 drives runs that wait on a slow model through ONE threaded worker process.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from config.celery import worker_argv

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOGS = ROOT / "var" / "bench"
CALLS_PER_RUN = 10  # tool calls per run in the worker figures


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 60.0, what: str = "condition", every: float = 0.1
) -> Any:
    """Poll `predicate()` every `every` seconds until it is truthy (for at most about
    `timeout` seconds); returns its value. The test suite waits with this one too."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def proc_memory(pid: int) -> dict[str, int]:
    """Resident set size now and at its peak (VmRSS, VmHWM), in bytes, from /proc."""
    fields: dict[str, int] = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return {"rss": fields["VmRSS"], "max_rss": fields["VmHWM"]}


def purge_broker() -> None:
    """Drop wake-ups of an earlier bench run (their runs were truncated away)."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    keys = [*client.scan_iter("airlock*"), *client.scan_iter("unacked*")]
    if keys:
        client.delete(*keys)
    client.close()


class Processes:
    """Worker and server subprocesses, each in its own process group, stopped at exit."""

    def __init__(self) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self) -> dict[str, str]:
        # The workers' defaults (INFO logs, persistent connections), on the bench's
        # database and broker.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "AIRLOCK_ALLOW_SCRIPTED": "1"}
        env.pop("LOG_LEVEL", None)
        return env

    def log(self, name: str) -> str:
        path = LOGS / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        path = LOGS / f"{name}.log"
        with path.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env={**self.env(), **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def worker(self, name: str, *, pool: str = "solo", env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        argv = worker_argv(hostname=f"{name}-{uuid.uuid4().hex[:6]}@%h", pool=pool, queues="airlock", heartbeat=False)
        proc = self.spawn(name, argv, env)
        wait_for(lambda: " ready." in self.log(name) or proc.poll() is not None, timeout=90, what=f"{name} ready")
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{self.log(name)[-3000:]}")
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # warm shutdown
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def profile(name: str, **fields: Any) -> Any:
    from agents.models import AgentProfile

    defaults = {"provider": "scripted", "tools": None, "always_ask_tools": [], "limits": {"max_steps": 1000}}
    obj, _ = AgentProfile.objects.update_or_create(name=name, defaults={**defaults, **fields})
    return obj


def echo_script(calls: int) -> list[dict[str, Any]]:
    return [{"call": {"tool": "echo", "args": {"text": f"step {i}"}}} for i in range(calls)] + [{"final": "done"}]


def launch_batch(agent: Any, script: list[dict[str, Any]], count: int, **kwargs: Any) -> tuple[list[int], float]:
    """Launch `count` runs in one transaction: their wake-ups go out together at commit.

    Returns the run ids and the wall-clock time of the commit.
    """
    from django.db import transaction

    from agents.actions.runs import run_launch

    with transaction.atomic():
        ids = [run_launch(agent=agent, task="bench", script=script, **kwargs).pk for _ in range(count)]
        committed = time.time()
    return ids, committed


def wait_done(ids: list[int], *, timeout: float, progress: Callable[[int], None] | None = None) -> None:
    from agents.models import Run

    deadline = time.monotonic() + timeout
    while True:
        done = Run.objects.filter(pk__in=ids, state="done").count()
        if progress:
            progress(done)
        if done == len(ids):
            return
        bad = Run.objects.filter(pk__in=ids, state__in=("failed", "cancelled")).values_list("pk", "error")[:3]
        if bad:
            raise RuntimeError(f"bench runs ended badly: {list(bad)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {done}/{len(ids)} runs done")
        time.sleep(0.25)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc/<pid>/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    values = [int(v) for v in pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def worker_phase(agent: Any, count: int, runs: int, calls: int) -> dict[str, Any]:
    """`runs` runs through `count` fresh solo workers; timed from the launch commit to
    the last run's finish (worker start-up and a warm-up batch are not timed)."""
    from django.db.models import Max

    from agents.models import Run, Transition

    purge_broker()
    procs = Processes()
    try:
        names = [f"bench-worker-{count}-{i}" for i in range(count)]
        for name in names:
            procs.worker(name)
        warm, _ = launch_batch(agent, echo_script(3), 4 * count)
        wait_done(warm, timeout=120)
        pids = {name: procs.procs[name].pid for name in names}
        at_start = {name: proc_memory(pid) for name, pid in pids.items()}
        cpu_start = sum(cpu_seconds(pid) for pid in pids.values())
        early: dict[str, dict[str, int]] = {}

        def sample_early(done: int) -> None:
            if not early and done >= runs // 10:
                early.update({name: proc_memory(pid) for name, pid in pids.items()})

        load = os.getloadavg()[0]
        busy_before, total_before = machine_cpu()
        ids, committed = launch_batch(agent, echo_script(calls), runs)
        wait_done(ids, timeout=600, progress=sample_early)
        busy_after, total_after = machine_cpu()
        at_end = {name: proc_memory(pid) for name, pid in pids.items()}
        cpu = sum(cpu_seconds(pid) for pid in pids.values()) - cpu_start
        finished = Run.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
        seconds = finished.timestamp() - committed
        transitions = Transition.objects.filter(run_id__in=ids, seq__gt=1).count()  # seq 1: the launch
    finally:
        procs.stop_all()
    return {
        "runs": runs,
        "seconds": seconds,
        "transitions": transitions,
        "worker_cpu_seconds": cpu,
        "load_before": load,
        # The whole machine's CPU (workers, PostgreSQL, Redis, this process): near 1.0
        # means the cores, not Airlock, bound the phase.
        "machine_cpu_busy": (busy_after - busy_before) / max(1, total_after - total_before),
        "rss_start": sum(m["rss"] for m in at_start.values()) / count,
        "rss_early": sum(m["rss"] for m in (early or at_start).values()) / count,
        "rss_end": sum(m["rss"] for m in at_end.values()) / count,
        "max_rss": max(m["max_rss"] for m in at_end.values()),
    }


def worker_throughput(runs: int = 500, calls: int = CALLS_PER_RUN, order: tuple[int, ...] = (1, 2, 2, 1)) -> dict[str, Any]:
    """Section 4: `runs` runs of `calls` echo calls through 1 and through 2 worker processes.

    The machine is shared, so its load drifts: the runs of each setting are split over
    phases in A-B-B-A order, which cancels a steady drift between the two settings.
    """
    agent = profile("bench-worker")
    per_phase = runs // order.count(order[0])
    phases = [(count, worker_phase(agent, count, per_phase, calls)) for count in order]
    out: dict[str, Any] = {"runs": runs, "calls_per_run": calls, "order": list(order)}
    for count in sorted(set(order)):
        mine = [p for c, p in phases if c == count]
        seconds = sum(p["seconds"] for p in mine)
        done = sum(p["runs"] for p in mine)
        transitions = sum(p["transitions"] for p in mine)
        out[f"workers_{count}"] = {
            "seconds": seconds,
            "runs_per_second": done / seconds,
            "transitions_per_second": transitions / seconds,
            "transitions": transitions,
            "worker_cpu_ms_per_transition": 1000 * sum(p["worker_cpu_seconds"] for p in mine) / transitions,
            "load_before": [p["load_before"] for p in mine],
            "machine_cpu_busy": sum(p["machine_cpu_busy"] for p in mine) / len(mine),
            # Memory of the last phase's workers: after start-up and warm-up, after a
            # tenth of the runs, at the end, and the peak (VmHWM).
            "rss_start_bytes": mine[-1]["rss_start"],
            "rss_early_bytes": mine[-1]["rss_early"],
            "rss_end_bytes": mine[-1]["rss_end"],
            "max_rss_bytes": max(p["max_rss"] for p in mine),
        }
    if "workers_1" in out and "workers_2" in out:
        out["scaling_2_to_1"] = out["workers_2"]["runs_per_second"] / out["workers_1"]["runs_per_second"]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts connections on loopback's `port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def reviewer() -> tuple[Any, str]:
    from django.contrib.auth.models import Group, User

    from agents.actions.tokens import token_create

    user, _ = User.objects.get_or_create(username="bench-reviewer")
    user.groups.add(Group.objects.get(name="reviewer"))
    _, raw = token_create(user=user, name="bench")
    return user, raw


def approval_latency(approvals: int = 200) -> dict[str, Any]:
    """Section 5: decision POST (real HTTP, Bearer token) -> the approved tool starts.

    The tool is `ledger_write`, always asked on this profile; the LedgerEntry it writes
    carries its own timestamp. One solo worker on Redis, idle when each decision lands.
    """
    from agents.models import Approval, LedgerEntry

    agent = profile("bench-approval", always_ask_tools=["ledger_write"])
    _, token = reviewer()
    purge_broker()
    procs = Processes()
    port = free_port()
    from_response: list[float] = []
    from_request: list[float] = []
    try:
        procs.worker("bench-approval-worker")
        server = procs.spawn("bench-server", [sys.executable, str(ROOT / "bench" / "serve.py"), str(port)])
        wait_for(lambda: "serving" in procs.log("bench-server") or server.poll() is not None, timeout=60, what="server")
        script = [{"call": {"tool": "ledger_write", "args": {"entry": "approved"}}}, {"final": "done"}]
        ids, _ = launch_batch(agent, script, approvals)
        wait_for(
            lambda: Approval.objects.filter(run_id__in=ids, status="pending").count() == len(ids),
            timeout=300,
            what="every run waiting for approval",
            every=0.25,
        )
        pending = list(
            Approval.objects.filter(run_id__in=ids, status="pending").order_by("pk").values_list("pk", "run_id")
        )
        for approval_id, run_id in pending:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/approvals/{approval_id}/decision",
                data=json.dumps({"decision": "approve", "note": "bench"}).encode(),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                method="POST",
            )
            sent = time.time()
            with urllib.request.urlopen(request, timeout=30) as response:
                body = json.loads(response.read())
            answered = time.time()
            if body.get("status") != "approved":
                raise RuntimeError(f"decision refused: {body}")
            started: dt.datetime = wait_for(
                lambda run_id=run_id: (
                    LedgerEntry.objects.filter(run_id=run_id).values_list("created_at", flat=True).first()
                ),
                timeout=30,
                what=f"the approved tool of run {run_id}",
                every=0.005,
            )
            from_response.append((started.timestamp() - answered) * 1000)
            from_request.append((started.timestamp() - sent) * 1000)
    finally:
        procs.stop_all()
    return {
        "approvals": len(from_response),
        "p50_ms": percentile(from_response, 50),
        "p95_ms": percentile(from_response, 95),
        "max_ms": max(from_response),
        "from_request_p50_ms": percentile(from_request, 50),
        "from_request_p95_ms": percentile(from_request, 95),
    }


CONCURRENCY_APP = "airlock-bench-worker"  # PGAPPNAME of its sessions, to count them


def concurrency(
    runs: int = 200, threads: int = 100, calls: int = 5, model_seconds: float = 1.0, tool_seconds: float = 0.5
) -> dict[str, Any]:
    """Section 6: `runs` runs of `calls` model calls answered after `model_seconds` by
    the slow provider (bench/waiting.py, real HTTP on loopback), each but the last
    asking for a `sleep` of `tool_seconds`, on ONE worker process of `threads` threads.

    A run alone takes `calls * model_seconds + (calls - 1) * tool_seconds`; the ideal
    for the batch is that times ceil(runs / threads): the latency bound. Runs in flight
    and the worker's database sessions are sampled in the database while the batch
    runs; RSS is read after a warm-up batch of `threads` runs and at the end.
    """
    import math

    from django.conf import settings
    from django.db.models import Max

    from agents.models import Run
    from bench.waiting import Sampler, SlowProvider

    agent = profile("bench-slow", provider="openai", model_name="slow", tools=["sleep"])
    pool_max = int(os.environ.get("AIRLOCK_DB_POOL_MAX", settings.AIRLOCK_DB_POOL_MAX))
    purge_broker()
    procs = Processes()
    try:
        with SlowProvider(delay=model_seconds, calls=calls, tool="sleep", tool_seconds=tool_seconds) as provider:
            env = {
                "AIRLOCK_WORKER_POOL": "threads", "AIRLOCK_WORKER_CONCURRENCY": str(threads),
                "OPENAI_BASE_URL": provider.url, "PGAPPNAME": CONCURRENCY_APP, "LOG_LEVEL": "WARNING",
            }  # fmt: skip
            pid = procs.worker("bench-threads", pool="threads", env=env).pid
            warm, _ = launch_batch(agent, None, threads)
            wait_done(warm, timeout=600)
            at_start = proc_memory(pid)
            load = os.getloadavg()[0]
            ids, committed = launch_batch(agent, None, runs)
            with Sampler(ids, application_name=CONCURRENCY_APP) as sampler:
                wait_done(ids, timeout=1200)
            at_end = proc_memory(pid)
            finished = Run.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
            model_requests = provider.requests
    finally:
        procs.stop_all()
    per_run = calls * model_seconds + (calls - 1) * tool_seconds
    ideal = math.ceil(runs / threads) * per_run
    seconds = finished.timestamp() - committed
    out: dict[str, Any] = {
        "runs": runs, "threads": threads, "processes": 1, "model_calls_per_run": calls,
        "model_seconds": model_seconds, "tool_seconds": tool_seconds, "model_requests": model_requests,
        "seconds": seconds, "ideal_seconds": ideal, "ratio_to_ideal": seconds / ideal,
        "most_in_flight": sampler.most_in_flight, "most_connections": sampler.most_connections,
        "pool_max": pool_max, "rss_start_bytes": at_start["rss"], "rss_end_bytes": at_end["rss"],
        "max_rss_bytes": at_end["max_rss"], "load_before": load,
    }  # fmt: skip
    return out
