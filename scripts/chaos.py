"""Workers under fire: launch M runs with side-effecting tools (a third of them tainted,
so their writes wait for a reviewer), SIGKILL workers at random K times (restarting
them) while a reviewer thread approves, rejects and answers "outcome unknown" as the
questions appear, wait, and print one JSON line with what survived.

    DATABASE_URL=... REDIS_URL=... python scripts/chaos.py --runs 200 --kills 20

Uses the configured database and broker (run `manage.py migrate` first); only the runs
it launches are counted. Leases and sweeps are shortened for the workers it starts
unless the environment sets them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
CHAOS_ENV = {"AIRLOCK_LEASE_SECONDS": "3", "AIRLOCK_SWEEP_SECONDS": "1", "AIRLOCK_IDLE_SECONDS": "2"}
for _name, _value in CHAOS_ENV.items():
    os.environ.setdefault(_name, _value)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db.models import Count  # noqa: E402

from agents.actions.approvals import approval_decide  # noqa: E402
from agents.actions.runs import run_launch  # noqa: E402
from agents.engine import states  # noqa: E402
from agents.models import Approval, LedgerEntry, Run  # noqa: E402
from agents.runs.verify import verify_run  # noqa: E402
from config.celery import beat_argv, worker_argv  # noqa: E402


class Fleet:
    """Worker processes (each its own process group) and one beat."""

    def __init__(self, workers: int, concurrency: int | None, pool: str, logdir: Path) -> None:
        self.concurrency = concurrency
        self.pool = pool
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.names = [f"chaos{i}" for i in range(workers)]

    def start(self, name: str) -> None:
        if name == "beat":
            argv = beat_argv(schedule=self.logdir / f"beat-{uuid.uuid4().hex[:6]}")
        else:
            # The pool goes through the setting: Celery swaps `--pool prefork` for it.
            hostname = f"{name}-{uuid.uuid4().hex[:6]}@%h"
            argv = worker_argv(hostname=hostname, concurrency=self.concurrency, heartbeat=False)
        with (self.logdir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=BASE,
                env={**os.environ, "AIRLOCK_WORKER_POOL": self.pool},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill_worker(self, name: str, rng: random.Random) -> str:
        """Half the time the whole worker (a machine dying), else one pool process
        (an OOM kill: the main process notices and starts a new one). A threaded worker
        has no pool processes: it is always killed whole, with every run it holds."""
        proc = self.procs[name]
        children = _children(proc.pid)
        if children and rng.random() < 0.5:
            os.kill(rng.choice(children), signal.SIGKILL)
            return "pool process"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.start(name)
        return "worker"

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def script_for(tag: str, rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A run's decisions and the ledger entries it may leave (entry -> tool), one row each.

    A third of the runs read an "external" page first: the run is tainted, so each later
    write asks a reviewer (approved or rejected by the reviewer thread).
    """
    items: list[dict[str, Any]] = []
    entries: dict[str, str] = {}
    if rng.random() < 1 / 3:
        items.append({"call": {"tool": "fetch_fixture", "args": {"text": f"page for {tag}"}}})
    for j in range(rng.randint(2, 5)):
        kind = rng.choice(["ledger_write", "ledger_write_unsafe", "sleep", "echo"])
        if kind == "sleep":
            # Distinct per step: an identical repeated call would (rightly) fail the run.
            args: dict[str, Any] = {"seconds": round(rng.uniform(0.05, 0.5), 2) + j / 1000}
        elif kind == "echo":
            args = {"text": f"{tag}-{j}"}
        else:
            entry = f"{tag}-{j}"
            args = {"entry": entry}
            entries[entry] = kind
        items.append({"call": {"tool": kind, "args": args}})
    items.append({"final": f"{tag} done"})
    return items, entries


def purge_broker() -> None:
    """Old wake-ups name runs of other experiments: drop them before starting."""
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        keys = [*client.scan_iter("airlock*"), *client.scan_iter("unacked*")]
        if keys:
            client.delete(*keys)
    else:
        for message in Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]).glob("*.msg"):
            message.unlink(missing_ok=True)


class Reviewer(threading.Thread):
    """Decides pending approvals as they appear, as people in the queue would.

    A policy question is approved or rejected at random (rejected calls leave no row);
    "outcome unknown" is answered from the ledger: it happened if its row exists, else
    run it again (a confirmed retry, the only way an unsafe call may run twice).
    """

    def __init__(self, ids: list[int], seed: int) -> None:
        super().__init__(name="chaos-reviewer", daemon=True)
        self.ids = ids
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.decided: Counter[str] = Counter()
        self.rejected: set[tuple[int, str]] = set()
        self.errors = 0

    def run(self) -> None:
        from django.db import connection

        user, _ = User.objects.get_or_create(username="chaos-reviewer")
        try:
            while not self.stopping.wait(0.2):
                try:
                    self.review(user)
                except Exception:  # noqa: BLE001 - a reviewer retries on the next look
                    self.errors += 1
        finally:
            connection.close()

    def review(self, user: User) -> None:
        for approval in Approval.objects.filter(run_id__in=self.ids, status="pending").order_by("pk"):
            entry = (approval.args or {}).get("entry")
            if approval.kind == "outcome_unknown":
                happened = LedgerEntry.objects.filter(run_id=approval.run_id, entry=entry).exists()
                decision = "happened" if happened else "retry"
            else:
                decision = "approve" if self.rng.random() < 0.7 else "reject"
            result = approval_decide(approval_id=approval.pk, user=user, decision=decision, note="chaos reviewer")
            if result.won:
                self.decided[decision] += 1
                if decision == "reject" and entry is not None:
                    self.rejected.add((approval.run_id, entry))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=None, help="per worker (default: the setting, 32)")
    parser.add_argument("--pool", choices=("threads", "prefork"), default="threads")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting after this many seconds")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    logdir = Path(settings.VAR_DIR) / "chaos"
    logdir.mkdir(parents=True, exist_ok=True)
    purge_broker()
    fleet = Fleet(args.workers, args.concurrency, args.pool, logdir)
    started = time.monotonic()
    expected: dict[int, dict[str, str]] = {}
    kill_log: Counter[str] = Counter()
    reviewer: Reviewer | None = None
    ids: list[int] = []
    try:
        for name in fleet.names:
            fleet.start(name)
        fleet.start("beat")
        batch = uuid.uuid4().hex[:8]
        for i in range(args.runs):
            script, entries = script_for(f"{batch}-{i}", rng)
            run = run_launch(agent="scripted", task=f"chaos {batch} #{i}", script=script)
            expected[run.pk] = entries
        ids = list(expected)
        reviewer = Reviewer(ids, seed)
        reviewer.start()
        for _ in range(args.kills):
            time.sleep(rng.uniform(0.3, 1.5))
            kill_log[fleet.kill_worker(rng.choice(fleet.names), rng)] += 1
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if not Run.objects.filter(pk__in=ids).exclude(state__in=states.TERMINAL).exists():
                break
            time.sleep(0.5)
    finally:
        if reviewer is not None:
            reviewer.stopping.set()
            reviewer.join(timeout=30)
        fleet.stop()
    report = tally(ids, expected, reviewer)
    report.update(
        kills=dict(kill_log),
        seconds=round(time.monotonic() - started, 1),
        seed=seed,
        broker="redis" if settings.REDIS_URL else "filesystem",
        pool=args.pool,
        database=settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
    )
    print(json.dumps(report))
    ok = (
        report["lost"] == 0
        and report["duplicate_safe_effects"] == 0
        and report["unsafe_effects_without_confirmation"] == 0
        and report["missing_side_effects"] == 0
        and report["verify_runs"] == "ok"
        and not report["poisoned"]
    )
    return 0 if ok else 1


def tally(ids: list[int], expected: dict[int, dict[str, str]], reviewer: Reviewer | None) -> dict[str, Any]:
    """What survived, counted from the rows.

    - duplicate safe effects: a `ledger_write` entry recorded more than once;
    - unsafe effects without confirmation: a `ledger_write_unsafe` entry recorded more
      often than once plus the reviewer's confirmed "retry" answers for that call;
    - missing: a done run lacks an entry nobody rejected.
    """
    runs = Run.objects.filter(pk__in=ids)
    by_state = Counter(runs.values_list("state", flat=True))
    rows = Counter(
        {
            (r["run_id"], r["entry"]): r["n"]
            for r in LedgerEntry.objects.filter(run_id__in=ids).values("run_id", "entry").annotate(n=Count("id"))
        }
    )
    retries = Counter(
        (a["run_id"], (a["args"] or {}).get("entry"))
        for a in Approval.objects.filter(run_id__in=ids, decision="retry").values("run_id", "args")
    )
    rejected = reviewer.rejected if reviewer is not None else set()
    dup_safe = unconfirmed = missing = 0
    done_ids = set(runs.filter(state=states.DONE).values_list("pk", flat=True))
    for pk, entries in expected.items():
        for entry, tool in entries.items():
            n = rows[(pk, entry)]
            if tool == "ledger_write":
                dup_safe += max(0, n - 1)
            else:
                unconfirmed += max(0, n - 1 - retries[(pk, entry)])
            if pk in done_ids and n == 0 and (pk, entry) not in rejected:
                missing += 1
    inconsistent = sum(1 for run in runs.iterator() if verify_run(run))
    finished = sum(by_state[s] for s in states.TERMINAL)
    return {
        "launched": len(ids),
        "finished": finished,
        "lost": len(ids) - finished,
        "duplicate_safe_effects": dup_safe,
        "unsafe_effects_without_confirmation": unconfirmed,
        "verify_runs": "ok" if inconsistent == 0 else f"{inconsistent} inconsistent",
        "done": by_state[states.DONE],
        "failed": by_state[states.FAILED],
        "missing_side_effects": missing,
        "decisions": dict(reviewer.decided) if reviewer is not None else {},
        "reviewer_errors": reviewer.errors if reviewer is not None else 0,
        "poisoned": runs.filter(error__startswith="poison run").count(),
        "failure_reasons": dict(
            Counter((e or "")[:60] for e in runs.filter(state=states.FAILED).values_list("error", flat=True))
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
