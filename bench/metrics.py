"""Section 7 of `make bench`: the cost of a Prometheus scrape of `GET /metrics` at the
seeded scale (100,000 runs, 10,000 pending approvals), run right after the page section.

1. Catch up: the first scrapes fold the seeded transition log into the tallies,
   FOLD_BATCH transitions per scrape (a one-off after an upgrade).
2. Steady state: scrapes with nothing new to fold, as every scrape at a 15 s interval
   is (a few hundred new transitions at most), timed in-process like the pages.
3. The roads not taken, measured on the same rows: the run totals as a GROUP BY over
   every run, first as it stands (a sequential scan), then with a covering index
   (an index-only scan; the index is created for the measurement and dropped). And the
   hot-path price of totals kept in the store's transaction instead: commits per second
   of concurrent single-statement inserts, alone and with an upsert of one shared
   per-agent totals row in the same statement (no extra round trip, but a row lock
   every commit queues on).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.workers import percentile

TOKEN = "bench-metrics-token"
TIMED = 30
TOTALS_SQL = (
    "select profile_id, state, count(*), sum(cost_micros), sum(tokens) from agents_run group by profile_id, state"
)


def _watermark() -> int:
    from agents.models import MetricTally
    from agents.ops.metrics import MARK

    return MetricTally.objects.filter(name=MARK).values_list("total", flat=True).first() or 0


def _timed(fn: Any, n: int = TIMED) -> dict[str, float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95)}


def _totals_query(cur: Any) -> dict[str, Any]:
    cur.execute("explain " + TOTALS_SQL)
    plan = " ".join(row[0] for row in cur.fetchall())
    scan = "index only" if "Index Only Scan" in plan else "sequential" if "Seq Scan" in plan else "other"
    return {"scan": scan, **_timed(lambda: (cur.execute(TOTALS_SQL), cur.fetchall()), n=10)}


def alternatives() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cur:
        as_is = _totals_query(cur)
        cur.execute(
            "create index bench_run_totals on agents_run (profile_id, state) include (cost_micros, tokens)"
        )
        try:
            cur.execute("vacuum analyze agents_run")  # the visibility map an index-only scan needs
            covered = _totals_query(cur)
        finally:
            cur.execute("drop index bench_run_totals")
    return {"group_by_runs": as_is, "group_by_runs_covering_index": covered}


INSERT = "insert into bench_log (body) values (%s)"
INSERT_AND_TOTAL = (
    "with t as (insert into bench_log (body) values (%s) returning id) "
    "insert into bench_totals (agent, n, cost) select 'bench', 1, 5 from t "
    "on conflict (agent) do update set n = bench_totals.n + 1, cost = bench_totals.cost + 5"
)


def _commit_rate(conninfo: dict[str, Any], sql: str, threads: int, seconds: float) -> float:
    import psycopg

    counts = [0] * threads
    start = threading.Barrier(threads + 1)

    def commit_loop(i: int) -> None:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            start.wait()
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                conn.execute(sql, ("x" * 200,))
                counts[i] += 1

    workers = [threading.Thread(target=commit_loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join()
    return sum(counts) / seconds


def store_aggregate(threads: int = 4, seconds: float = 2.0) -> dict[str, Any]:
    from django.db import connection

    s = connection.settings_dict
    conninfo = {"dbname": s["NAME"], "user": s["USER"], "password": s["PASSWORD"], "host": s["HOST"],
                "port": s["PORT"] or 5432}
    with connection.cursor() as cur:
        cur.execute("create table bench_log (id bigserial primary key, body text)")
        cur.execute("create table bench_totals (agent text primary key, n bigint, cost bigint)")
    try:
        plain = _commit_rate(conninfo, INSERT, threads, seconds)
        shared = _commit_rate(conninfo, INSERT_AND_TOTAL, threads, seconds)
    finally:
        with connection.cursor() as cur:
            cur.execute("drop table bench_log, bench_totals")
    return {"threads": threads, "plain_commits_per_second": plain, "with_shared_total_commits_per_second": shared,
            "ratio": shared / plain}


def metrics_bench() -> dict[str, Any]:
    from django.db import connection
    from django.test import Client, override_settings
    from django.test.utils import CaptureQueriesContext
    from prometheus_client.parser import text_string_to_metric_families

    from agents.models import Approval, Run, Transition

    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    out: dict[str, Any] = {
        "rows": {
            "runs": Run.objects.count(),
            "transitions": Transition.objects.count(),
            "pending_approvals": Approval.objects.filter(status="pending").count(),
        }
    }
    with override_settings(AIRLOCK_METRICS_TOKEN=TOKEN, AIRLOCK_METRICS_FOLD_LAG_SECONDS=0):
        started, scrapes = time.perf_counter(), 0
        while True:
            before = _watermark()
            assert client.get("/metrics", **auth).status_code == 200
            scrapes += 1
            if _watermark() == before:
                break
        out["catch_up"] = {"scrapes": scrapes, "seconds": time.perf_counter() - started}
        with CaptureQueriesContext(connection) as captured:
            body = client.get("/metrics", **auth).content.decode()
        out["queries"] = len(captured)
        out["bytes"] = len(body)
        families = {f.name: f for f in text_string_to_metric_families(body)}
        counted = sum(s.value for s in families["airlock_runs"].samples)
        assert counted == out["rows"]["runs"], (counted, out["rows"]["runs"])
        out["steady"] = _timed(lambda: client.get("/metrics", **auth))
    out["alternatives"] = alternatives()
    out["store_aggregate"] = store_aggregate()
    connection.close()
    return out
