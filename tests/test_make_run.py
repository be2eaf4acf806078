"""`make run` in a temporary copy of the project: the dashboard on the embedded default
(SQLite, filesystem broker, no Redis) answers, serves its static files, and its worker
advances a launched run; Ctrl-C stops everything. A worker that dies is restarted
while the web keeps serving, and SIGTERM stops all (issue 25)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
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


REFUND = "My blender from order 1042 arrived broken. Please refund it. - Sam (sam@example.com)"


class MakeRun:
    """`make run` in a copy of the project (embedded default), its output in a file, and
    the API as the project's admin: for the supervisor test and the soak test."""

    def __init__(self, root: Path, **env: str) -> None:
        copy_project(root)
        self.root, self.port, self.log = root, free_port(), root / "make-run.log"
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_"))}
        self.env.update({"PORT": str(self.port), "PY": sys.executable, "AIRLOCK_SWEEP_SECONDS": "1", **env})
        self.headers: dict[str, dict[str, str]] = {}

    def __enter__(self) -> MakeRun:
        with self.log.open("wb") as out:
            # -o: the project is installed already (this interpreter); don't rebuild a venv.
            self.proc = subprocess.Popen(
                ["make", "-o", ".venv/.installed", f"PY={sys.executable}", "run"],
                cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_for(served(lambda: self.get("/healthz").status_code == 200), timeout=180, what="make run", every=0.5)
        # The admin launches; the demo profile separates duties, so a reviewer decides.
        for user in ("admin", "reviewer"):
            token = self.manage("create_api_token", user).stdout.strip().splitlines()[-1]
            self.headers[user] = {"Authorization": f"Bearer {token}"}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in self.pids("web") + self.pids("worker") + self.pids("beat"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # only after a failure: stop() left none

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self, name: str) -> list[int]:
        """Every pid the supervisor started `name` as, in order."""
        return [int(p) for p in re.findall(rf"^airlock: {name} started \(pid (\d+)\)", self.output(), re.M)]

    def supervisor(self) -> int:
        return int(re.findall(r"^airlock: web on .* \(pid (\d+)\)", self.output(), re.M)[0])

    def get(self, path: str, user: str = "admin") -> httpx.Response:
        return httpx.get(self.base + path, headers=self.headers.get(user), timeout=30)

    def post(self, path: str, body: dict[str, Any], user: str = "admin") -> httpx.Response:
        return httpx.post(self.base + path, json=body, headers=self.headers.get(user), timeout=30)

    def decide(self, approval_id: int, decision: str) -> httpx.Response:
        return self.post(f"/api/approvals/{approval_id}/decision", {"decision": decision, "note": "ok"}, "reviewer")

    def launch(self, task: str) -> int:
        launched = self.post("/api/runs", {"agent": "demo", "task": task})
        assert launched.status_code == 201, launched.text
        return int(launched.json()["id"])

    def wait_state(self, run_id: int, state: str, timeout: float = 120) -> dict[str, Any]:
        return wait_for(
            served(lambda: (r := self.get(f"/api/runs/{run_id}").json())["state"] == state and r),
            timeout=timeout, what=f"run {run_id} to reach {state}", every=0.5,
        )  # fmt: skip

    def manage(self, *argv: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "manage.py", *argv], cwd=self.root, env=self.env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        return done


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_make_run_restarts_a_dead_worker_while_the_web_keeps_serving(tmp_path: Path) -> None:
    # What a torn write leaves in the queue: the stock transport's worker died on it.
    queue = tmp_path / "var" / "broker" / "queue"
    queue.mkdir(parents=True)
    (queue / "0_torn.airlock.msg").write_bytes(b'{"body": "eyJydW4iOi')
    with MakeRun(tmp_path, AIRLOCK_LEASE_SECONDS="3", AIRLOCK_IDLE_SECONDS="2") as app:
        first = app.launch(REFUND)
        app.wait_state(first, "awaiting_approval")
        assert "skipped unreadable message file 0_torn.airlock.msg" in app.output()
        [worker] = app.pids("worker")  # the torn file did not kill it
        assert (tmp_path / "var" / "broker" / "bad" / "0_torn.airlock.msg").exists()

        os.killpg(worker, signal.SIGKILL)  # the worker and its pool, as the OOM killer would

        def restarted() -> bool:
            # The dashboard answers all along, the worker down or not.
            assert app.get("/healthz").status_code == 200
            assert app.get(f"/api/runs/{first}").status_code == 200
            return len(app.pids("worker")) == 2

        wait_for(restarted, timeout=60, what="the worker to be restarted", every=0.2)
        assert f"airlock: worker (pid {worker}) exited with -9; restarting it in 1 s" in app.output()
        new_worker = app.pids("worker")[1]
        assert new_worker != worker and alive(new_worker) and not alive(worker)
        [web], [beat] = app.pids("web"), app.pids("beat")  # neither was restarted
        # The new worker does the work: the refund, approved, runs and the run ends.
        approval = app.get(f"/api/runs/{first}").json()["pending_approval"]["id"]
        decided = app.decide(approval, "approve")
        assert decided.status_code == 200, decided.text
        assert app.wait_state(first, "done")["answer"]

        os.kill(app.supervisor(), signal.SIGTERM)  # what `kill`, systemd or docker stop send
        assert app.proc.wait(timeout=60) == 0, app.output()[-3000:]
        assert [pid for pid in (web, beat, new_worker) if alive(pid)] == []
        assert "airlock: stopped" in app.output()
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes left running: {leftovers}"


def test_a_second_make_run_on_a_busy_port_says_so_once_and_starts_nothing(tmp_path: Path) -> None:
    """#47, item 5: it printed "web on ..." and looped "port already in use" while its
    worker and a second beat attached to the same broker."""
    copy_project(tmp_path)
    import socket

    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_"))}
        env.update({"PORT": str(port), "PY": sys.executable})
        done = subprocess.run(
            ["make", "-s", "-o", ".venv/.installed", f"PY={sys.executable}", "run"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode != 0
    ours = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("airlock:")]
    assert ours == [
        f"airlock: port {port} is already in use (another `make run`?); nothing started: "
        f"stop that one, or choose another port: PORT={port + 1} make run"
    ]
    assert "started (pid" not in done.stdout + done.stderr
    assert not (tmp_path / "var" / "demo-users.txt").exists()  # not even migrate and seed ran


def test_make_run_says_web_on_only_once_the_server_answers(tmp_path: Path) -> None:
    """#47, item 5: the line came about 3 s before the server answered."""
    app = MakeRun(tmp_path)
    with app.log.open("wb") as out:
        app.proc = subprocess.Popen(
            ["make", "-o", ".venv/.installed", f"PY={sys.executable}", "run"],
            cwd=app.root, env=app.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "airlock: web on " in app.output(), timeout=180, what="the web on line", every=0.05)
        # At once, no retry: the line promises a server that answers now.
        assert httpx.get(f"{app.base}/healthz", timeout=5).status_code == 200
        assert len(re.findall(r"^airlock: web on ", app.output(), re.M)) == 1
    finally:
        app.__exit__(None, None, None)
