"""`make run` in a temporary copy of the project: the dashboard on the embedded default
(SQLite, filesystem broker, no Redis) answers, serves its static files, and its worker
advances a launched run; Ctrl-C stops everything."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.worker


def copy_project(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)


def served(predicate: Callable[[], Any]) -> Callable[[], Any]:
    """`predicate`, answering None while the server does not listen yet."""

    def attempt() -> Any:
        try:
            return predicate()
        except httpx.TransportError:
            return None

    return attempt


def test_make_run_serves_the_dashboard_and_its_worker_advances_runs(tmp_path: Path) -> None:
    copy_project(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_"))}
    env.update({"PORT": str(port), "PY": sys.executable, "AIRLOCK_SWEEP_SECONDS": "1"})
    # -o: the project is installed already (this interpreter); don't rebuild a venv.
    proc = subprocess.Popen(
        ["make", "-o", ".venv/.installed", f"PY={sys.executable}", "run"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        login = wait_for(
            served(lambda: (r := httpx.get(f"{base}/login/")).status_code == 200 and r),
            timeout=120, what="/login/", every=0.5,
        )
        assert "Log in to Airlock" in login.text
        for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', login.text):
            assert httpx.get(base + src).status_code == 200, src
        passwords = (tmp_path / "var" / "demo-users.txt").read_text()
        assert re.search(r"^reviewer\b", passwords, re.M)
        token = subprocess.run(
            [sys.executable, "manage.py", "create_api_token", "admin"],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        headers = {"Authorization": f"Bearer {token}"}
        refund = "My blender from order 1042 arrived broken. Please refund it. - Sam (sam@example.com)"
        launched = httpx.post(f"{base}/api/runs", json={"agent": "demo", "task": refund}, headers=headers)
        assert launched.status_code == 201, launched.text
        run_id = launched.json()["id"]
        # Only the worker advances this run: the web process just commits the launch.
        run = wait_for(
            served(
                lambda: (r := httpx.get(f"{base}/api/runs/{run_id}", headers=headers).json())["state"]
                == "awaiting_approval" and r
            ),
            timeout=60, what="the worker to bring the run to awaiting_approval", every=0.5,
        )
        assert run["pending_approval"]["tool"] == "refund"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            raise AssertionError("make run did not stop on Ctrl-C:\n" + output[-3000:]) from None
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes left running: {leftovers}"
