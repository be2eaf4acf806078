"""The embedded default (SQLite in WAL mode, the filesystem broker, no server at all)
with the threaded worker: 40 runs waiting on a slow model are in flight together, and
its writers queue behind the busy timeout instead of failing with "database is
locked"."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.waiting import SlowProvider
from tests.helpers import wait_for
from tests.workers.cluster import BASE, Cluster

pytestmark = pytest.mark.worker

LAUNCH = """
import django, json, sys
django.setup()
from agents.actions.runs import run_launch
from agents.models import AgentProfile
AgentProfile.objects.create(name="slow", provider="openai", model_name="slow-1", tools=["sleep"])
print(json.dumps([run_launch(agent="slow", task=f"wait {i}").pk for i in range(int(sys.argv[1]))]))
"""


def manage(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(argv, cwd=BASE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_forty_waiting_runs_in_flight_on_sqlite_and_the_filesystem_broker(tmp_path: Path) -> None:
    var = tmp_path / "var"
    database = var / "airlock.sqlite3"
    cluster = Cluster(tmp_path, "")  # no REDIS_URL: the filesystem broker under var/
    with SlowProvider(delay=1.0, calls=3, tool="sleep", tool_seconds=0.5) as provider:
        env = cluster.env(
            AIRLOCK_VAR_DIR=str(var), DATABASE_URL=f"sqlite:///{database}", OPENAI_BASE_URL=provider.url,
            DJANGO_SETTINGS_MODULE="config.settings",
        )  # fmt: skip
        manage(env, sys.executable, "manage.py", "migrate", "--noinput", "-v0")
        try:
            cluster.start_worker("w1", **{k: env[k] for k in ("AIRLOCK_VAR_DIR", "DATABASE_URL", "OPENAI_BASE_URL")})
            ids = json.loads(manage(env, sys.executable, "-c", LAUNCH, "40").strip().splitlines()[-1])
            db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=20)
            marks = ",".join("?" * len(ids))
            most = 0

            def all_done() -> bool:
                nonlocal most
                held, done = db.execute(
                    f"select sum(lease_owner like 'worker:%'), sum(state = 'done') from agents_run where id in ({marks})",
                    ids,
                ).fetchone()
                most = max(most, held or 0)
                time.sleep(0.05)
                return done == 40

            wait_for(all_done, timeout=240, what="40 runs done on SQLite")
            answers = {row[0] for row in db.execute(f"select answer from agents_run where id in ({marks})", ids)}
            db.close()
        finally:
            cluster.stop_all()
    assert answers == {"done after 3 calls"}
    assert provider.requests == 40 * 3
    assert most >= 16, f"only {most} runs in flight at once"
    log = cluster.log("w1")
    assert "database is locked" not in log and "Traceback" not in log
