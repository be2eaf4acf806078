"""`make bench`'s purge figures (issue 31): purge BENCH_PURGE_RUNS (100,000) finished
runs of about ten transitions each, while live runs are driven beside it.

Prints and writes into bench/results.json (key "retention"): the purge's seconds, the
table bytes before, after the purge, after VACUUM and after VACUUM FULL, the WAL written
while it ran, and the p99 latency of live runs' commit statements (the one-statement
UPDATE of agents_run) during the purge against the same figure without it, which must
stay within 2x. BENCH_PURGE_RUNS=0 skips it.

The purge runs as a deployment runs it: `manage.py purge_runs` in its own process with
its own connection (the sweeper's daily job is a process of its own too), while this
process drives the live runs. A purge in a thread of this process measured the GIL
instead of the database: each live statement is timed around Django's execute wrapper,
so it also counted the wait for the interpreter while the purge thread built skeletons
and JSON (the switch interval is 5 ms), and the p99 read 8x what it was without.
The baseline is two windows of BENCH_PURGE_BASELINE_SECONDS / 2 each, one before the
purge and one after it, pooled: a drift in the machine's load (other work on its two
cores) then meets both sides of the ratio instead of only one.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import run as base  # noqa: E402 (its setup_django sets the environment)

TABLES = ("agents_run", "agents_transition", "agents_message", "agents_toolcall", "agents_approval")


class LiveRuns(threading.Thread):
    """Launch and drive short runs one after another until stopped, timing each commit
    statement of theirs (Django's execute wrapper, on this thread's connection only)."""

    def __init__(self, profile: Any) -> None:
        super().__init__(daemon=True)
        self.profile = profile
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.runs: list[int] = []
        self.error: BaseException | None = None

    def _timed(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if "UPDATE agents_run" in sql or "update agents_run" in sql:
                self.latencies.append((time.perf_counter() - started) * 1000)

    def run(self) -> None:
        from django.db import connection

        from agents.actions.runs import run_launch

        try:
            with connection.execute_wrapper(self._timed):
                while not self.stop.is_set():
                    launched = run_launch(agent=self.profile.name, task="live", script=base.script_of(3))
                    base.drive(launched)
                    self.runs.append(launched.pk)
        except BaseException as exc:  # reported by the caller
            self.error = exc
        finally:
            connection.close()


def _live_while(profile: Any, work: Callable[[], Any]) -> tuple[LiveRuns, Any]:
    """Drive live runs for as long as `work()` takes; (the live runs, what `work` returned)."""
    live = LiveRuns(profile)
    live.start()
    try:
        value = work()
    finally:
        live.stop.set()
        live.join()
    if live.error:
        raise live.error
    return live, value


def _purge_process() -> dict[str, Any]:
    """`manage.py purge_runs --older-than 300` in a process of its own: its wall seconds
    (process start included, as an operator waits for it) and the WAL written meanwhile."""
    wal = base.wal_lsn()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "purge_runs", "--older-than", "300"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"purge_runs exited {done.returncode}: {done.stderr[-2000:]}")
    return {"seconds": seconds, "wal": base.wal_lsn() - wal, "output": done.stdout.strip()}


def _vacuum(full: bool) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        for table in TABLES:
            cur.execute(f"vacuum {'full ' if full else ''}{table}")


def retention_bench(runs: int = 100_000) -> dict[str, Any]:
    from django.db import connection

    from agents.actions.runs import run_launch
    from agents.models import PurgeRecord, Run, Transition
    from bench.seed import clone_runs, settle
    from bench.workers import percentile

    profile = base.bench_profile()
    template = base.drive(run_launch(agent=profile.name, task="template " + "t" * 400, script=base.script_of(4)))
    assert template.state == "done", template.error
    clone_runs(template, runs - 1)
    with connection.cursor() as cur:
        cur.execute("update agents_run set finished_at = now() - interval '400 days' where state = 'done'")
    settle()
    transitions = Transition.objects.count()
    before = base.table_bytes(TABLES)

    window = float(os.environ.get("BENCH_PURGE_BASELINE_SECONDS", "20")) / 2
    before_window, _ = _live_while(profile, lambda: time.sleep(window))
    during, result = _live_while(profile, _purge_process)
    record = PurgeRecord.objects.latest("pk")
    after_purge = base.table_bytes(TABLES)
    after_window, _ = _live_while(profile, lambda: time.sleep(window))
    baseline = before_window.latencies + after_window.latencies
    baseline_runs = before_window.runs + after_window.runs
    _vacuum(full=False)
    after_vacuum = base.table_bytes(TABLES)
    _vacuum(full=True)
    after_full = base.table_bytes(TABLES)
    p99_base = percentile(baseline, 99)
    p99_during = percentile(during.latencies, 99)
    return {
        "runs": record.runs,
        "transitions": transitions,
        "purge_seconds": round(result["seconds"], 1),
        "runs_per_second": round(record.runs / max(result["seconds"], 1e-9)),
        "wal_bytes": result["wal"],
        "bytes_before": before,
        "bytes_after_purge": after_purge,
        "bytes_after_vacuum": after_vacuum,
        "bytes_after_vacuum_full": after_full,
        "bytes_given_back": before - after_full,
        "live_commits_without_purge": len(baseline),
        "live_commit_p99_ms_before_purge": round(percentile(before_window.latencies, 99), 2),
        "live_commit_p99_ms_after_purge": round(percentile(after_window.latencies, 99), 2),
        "live_commits_during_purge": len(during.latencies),
        "live_commit_p99_ms_without_purge": round(p99_base, 2),
        "live_commit_p99_ms_during_purge": round(p99_during, 2),
        "p99_ratio": round(p99_during / max(p99_base, 1e-9), 2),
        "live_runs_during_purge": len(during.runs),
        "live_runs_purged": Run.objects.filter(pk__in=during.runs + baseline_runs, purged_at__isnull=False).count(),
    }


def main() -> None:
    runs = int(os.environ.get("BENCH_PURGE_RUNS", "100000"))
    if runs <= 0:
        print("retention bench skipped (BENCH_PURGE_RUNS=0)")
        return
    base.setup_django()
    base.truncate()
    r = retention_bench(runs)
    out = ROOT / "bench" / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["retention"] = r
    out.write_text(json.dumps(results, indent=2))
    mb = 1024 * 1024
    print(
        f"purge: {r['runs']} runs ({r['transitions']} transitions) in {r['purge_seconds']} s "
        f"({r['runs_per_second']} runs/s), WAL {r['wal_bytes'] / mb:.0f} MB"
    )
    print(
        f"disk: {r['bytes_before'] / mb:.0f} MB before, {r['bytes_after_purge'] / mb:.0f} MB after the purge, "
        f"{r['bytes_after_vacuum'] / mb:.0f} MB after VACUUM, {r['bytes_after_vacuum_full'] / mb:.0f} MB after VACUUM FULL "
        f"({r['bytes_given_back'] / mb:.0f} MB given back)"
    )
    verdict = "met" if r["p99_ratio"] <= 2.0 else "MISSED"
    print(
        f"live commits p99: {r['live_commit_p99_ms_during_purge']} ms during the purge, "
        f"{r['live_commit_p99_ms_without_purge']} ms without ({r['p99_ratio']}x; target <= 2x: {verdict}); "
        f"{r['live_runs_purged']} live runs purged"
    )
    print(
        f"  ({r['live_commits_during_purge']} live commits during, {r['live_commits_without_purge']} without: "
        f"p99 {r['live_commit_p99_ms_before_purge']} ms before the purge, {r['live_commit_p99_ms_after_purge']} ms after)"
    )


if __name__ == "__main__":
    main()
