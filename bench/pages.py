"""Section 6 of `make bench`: page cost with a big database, against a minimal page.

Server time is measured in-process through Django's test client (the whole middleware
stack and template rendering, no network), the pages of a comparison taking turns
(`measure`); query counts with CaptureQueriesContext. Each page is measured at a small scale and at the full one: a constant query count
means no query per row.
"""

from __future__ import annotations

import time
from typing import Any

FULL = {"runs": 100_000, "pending": 10_000, "timeline_steps": 1_000}
SMALL = {"runs": 1_000, "pending": 100}
TIMED = 30  # requests per page and scale, after WARM ones
WARM = 3


def _drive(agent: Any, script: list[dict[str, Any]]) -> Any:
    from agents.actions.runs import run_launch
    from bench import run as bench  # the in-process driver with the bench tool

    return bench.drive(run_launch(agent=agent, task="bench pages", script=script))


def templates() -> dict[str, Any]:
    """Real runs, driven through the store, to clone: finished (11 transitions), waiting
    for a reviewer (9), and the long timelines (a 10-step run and a 1,000-step one)."""
    from bench import run as bench
    from bench.workers import profile

    plain = bench.bench_profile()
    asking = profile("bench-approval", always_ask_tools=["ledger_write"])
    done = _drive(plain, bench.script_of(4))
    waiting = _drive(
        asking,
        [*bench.script_of(3)[:-1], {"call": {"tool": "ledger_write", "args": {"entry": "x"}}}, {"final": "done"}],
    )
    assert done.state == "done" and waiting.state == "awaiting_approval", (done.state, waiting.state)
    # Each tool call is two steps (the model's call, the tool): 500 calls = 1,000 steps.
    long = _drive(plain, bench.script_of(FULL["timeline_steps"] // 2))
    short = _drive(plain, bench.script_of(5))
    return {"done": done, "waiting": waiting, "long": long, "short": short}


def seed_to(t: dict[str, Any], runs: int, pending: int) -> float:
    """Clone until there are `runs` runs, `pending` of them waiting; returns seconds."""
    from agents.models import Approval, Run
    from bench import seed

    started = time.perf_counter()
    need_pending = pending - Approval.objects.filter(status="pending").count()
    if need_pending > 0:
        seed.clone_runs(t["waiting"], need_pending)
    need_runs = runs - Run.objects.count()
    if need_runs > 0:
        seed.clone_runs(t["done"], need_runs, parts=("transitions",))
    seed.settle()
    return time.perf_counter() - started


def measure(client: Any, urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each page of `urls` (name -> URL): its queries, p50 and p95 in ms, and size. The
    timed requests take turns (one of each page, TIMED times over), so a change in the
    machine's load meets every page alike: measured one page after another, a busy
    second under one page and not the next moved their ratio by a third."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.workers import percentile

    out: dict[str, dict[str, Any]] = {}
    for name, url in urls.items():
        for _ in range(WARM):
            assert client.get(url).status_code == 200, url
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        # Counted now: the next request's start clears the log the context reads lazily.
        out[name] = {"queries": len(captured), "bytes": len(response.content)}
        assert response.status_code == 200, url
    times: dict[str, list[float]] = {name: [] for name in urls}
    for _ in range(TIMED):
        for name, url in urls.items():
            start = time.perf_counter()
            client.get(url)
            times[name].append((time.perf_counter() - start) * 1000)
    for name, page in out.items():
        page["p50_ms"] = percentile(times[name], 50)
        page["p95_ms"] = percentile(times[name], 95)
    return out


def measure_all(client: Any, *, timeline: Any) -> dict[str, Any]:
    pages = {
        "minimal": "/bench/minimal/",
        "reviews": "/reviews/",
        "runs": "/runs/",
        "timeline": f"/runs/{timeline.pk}/",
    }
    return measure(client, pages)


def pages_bench() -> dict[str, Any]:
    from django.db import connection
    from django.test import Client, override_settings

    from agents.models import Run, Transition
    from bench.workers import reviewer

    user, _ = reviewer()
    client = Client()
    client.force_login(user)
    out: dict[str, Any] = {}
    started = time.perf_counter()
    t = templates()
    out["template_seconds"] = time.perf_counter() - started
    with override_settings(ROOT_URLCONF="bench.urls"):
        out["seed_small_seconds"] = seed_to(t, SMALL["runs"], SMALL["pending"])
        small = measure_all(client, timeline=t["short"])
        out["seed_full_seconds"] = seed_to(t, FULL["runs"], FULL["pending"])
        full = measure_all(client, timeline=t["long"])
    out["rows"] = {
        "runs": Run.objects.count(),
        "transitions": Transition.objects.count(),
        "pending_approvals": Run.objects.filter(state="awaiting_approval").count(),
        "timeline_transitions": Transition.objects.filter(run=t["long"]).count(),
    }
    out["small"], out["full"] = small, full
    for name, page in full.items():
        page["ratio_p50_to_minimal"] = page["p50_ms"] / full["minimal"]["p50_ms"]
        page["ratio_p95_to_minimal"] = page["p95_ms"] / full["minimal"]["p95_ms"]
        page["constant_queries"] = page["queries"] == small[name]["queries"]
    connection.close()
    return out
