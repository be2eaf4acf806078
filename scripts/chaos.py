"""Workers under fire: launch M runs with side-effecting tools, SIGKILL workers at
random K times (restarting them), resolve "outcome unknown" questions as a reviewer
would, wait, and print one JSON line with what survived.

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

from agents.actions import approval_decide, run_launch  # noqa: E402
from agents.engine import states  # noqa: E402
from agents.models import Approval, LedgerEntry, Run  # noqa: E402
from agents.verify import verify_run  # noqa: E402


class Fleet:
    """Worker processes (each its own process group) and one beat."""

    def __init__(self, workers: int, concurrency: int, logdir: Path) -> None:
        self.concurrency = concurrency
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.names = [f"chaos{i}" for i in range(workers)]

    def start(self, name: str) -> None:
        if name == "beat":
            argv = ["beat", "--schedule", str(self.logdir / f"beat-{uuid.uuid4().hex[:6]}")]
        else:
            argv = [
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                str(self.concurrency),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--hostname",
                f"{name}-{uuid.uuid4().hex[:6]}@%h",
            ]
        with (self.logdir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "config", *argv, "--loglevel", "INFO"],
                cwd=BASE,
                env=os.environ.copy(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill_worker(self, name: str, rng: random.Random) -> str:
        """Half the time the whole worker (a machine dying), else one pool process
        (an OOM kill: the main process notices and starts a new one)."""
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


def script_for(tag: str, rng: random.Random) -> tuple[list[dict[str, Any]], list[str]]:
    """A run's decisions and the ledger entries it should leave, one row each."""
    items: list[dict[str, Any]] = []
    entries: list[str] = []
    for j in range(rng.randint(2, 5)):
        kind = rng.choice(["ledger_write", "ledger_write_unsafe", "sleep", "echo"])
        if kind == "sleep":
            args: dict[str, Any] = {"seconds": round(rng.uniform(0.05, 0.5), 3)}
        elif kind == "echo":
            args = {"text": f"{tag}-{j}"}
        else:
            entry = f"{tag}-{j}"
            args = {"entry": entry}
            entries.append(entry)
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


def resolve_unknown(ids: list[int], reviewer: User, expected: dict[int, list[str]]) -> int:
    """Answer "outcome unknown" as a reviewer would: it happened if its row exists."""
    answered = 0
    for approval in Approval.objects.filter(run_id__in=ids, status="pending", kind="outcome_unknown"):
        entry = (approval.args or {}).get("entry")
        happened = LedgerEntry.objects.filter(run_id=approval.run_id, entry=entry).exists()
        decision = "happened" if happened else "retry"
        result = approval_decide(approval_id=approval.pk, user=reviewer, decision=decision, note="checked the ledger")
        answered += int(result.won)
    return answered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting after this many seconds")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    logdir = Path(settings.VAR_DIR) / "chaos"
    logdir.mkdir(parents=True, exist_ok=True)
    purge_broker()
    fleet = Fleet(args.workers, args.concurrency, logdir)
    reviewer, _ = User.objects.get_or_create(username="chaos-reviewer")
    started = time.monotonic()
    expected: dict[int, list[str]] = {}
    kill_log: Counter[str] = Counter()
    answered = 0
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
        for _ in range(args.kills):
            time.sleep(rng.uniform(0.3, 1.5))
            kill_log[fleet.kill_worker(rng.choice(fleet.names), rng)] += 1
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            answered += resolve_unknown(ids, reviewer, expected)
            if not Run.objects.filter(pk__in=ids).exclude(state__in=states.TERMINAL).exists():
                break
            time.sleep(0.5)
    finally:
        fleet.stop()
    runs = Run.objects.filter(pk__in=ids)
    by_state = Counter(runs.values_list("state", flat=True))
    rows = Counter(
        {
            (r["run_id"], r["entry"]): r["n"]
            for r in LedgerEntry.objects.filter(run_id__in=ids).values("run_id", "entry").annotate(n=Count("id"))
        }
    )
    done_ids = set(runs.filter(state=states.DONE).values_list("pk", flat=True))
    duplicates = sum(n - 1 for n in rows.values() if n > 1)
    missing = sum(1 for pk in done_ids for e in expected[pk] if rows[(pk, e)] == 0)
    inconsistent = sum(1 for run in runs.iterator() if verify_run(run))
    report = {
        "runs_launched": len(ids),
        "finished": sum(by_state[s] for s in states.TERMINAL),
        "done": by_state[states.DONE],
        "failed": by_state[states.FAILED],
        "lost": len(ids) - sum(by_state[s] for s in states.TERMINAL),
        "duplicate_side_effects": duplicates,
        "missing_side_effects": missing,
        "outcome_unknown_resolved": answered,
        "poisoned": runs.filter(error__startswith="poison run").count(),
        "failure_reasons": dict(
            Counter((e or "")[:60] for e in runs.filter(state=states.FAILED).values_list("error", flat=True))
        ),
        "kills": dict(kill_log),
        "verify_runs": "ok" if inconsistent == 0 else f"{inconsistent} inconsistent",
        "seconds": round(time.monotonic() - started, 1),
        "seed": seed,
        "broker": "redis" if settings.REDIS_URL else "filesystem",
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
    }
    print(json.dumps(report))
    ok = report["lost"] == 0 and duplicates == 0 and missing == 0 and inconsistent == 0 and not report["poisoned"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
