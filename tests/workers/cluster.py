"""Real Celery workers and beat as subprocesses (fixtures `cluster`, `broker_url`,
`private_redis`, registered for the whole suite by tests/conftest.py), pointed at pytest-django's test
database and at this test run's broker (REDIS_URL, or the filesystem broker under
var/ when it is unset). Short leases and sweeps keep the suite quick."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from config.celery import beat_argv, worker_argv
from tests.helpers import free_port, listening, requires_postgres, wait_for

BASE = Path(__file__).resolve().parents[2]
LEASE_SECONDS = "2"
FAST = {
    "AIRLOCK_LEASE_SECONDS": LEASE_SECONDS,
    "AIRLOCK_SWEEP_SECONDS": "0.5",
    "AIRLOCK_IDLE_SECONDS": "1",
    "DB_CONN_MAX_AGE": "0",
    "PYTHONUNBUFFERED": "1",
}


# Worker processes share the test database, so it has to be a server (PostgreSQL).
MARKS = [pytest.mark.worker, requires_postgres(), pytest.mark.django_db(transaction=True)]


def worker_database_url() -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def purge_broker(redis_url: str) -> None:
    """Drop wake-ups left by earlier tests (their runs were flushed away)."""
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        keys = [*client.scan_iter("airlock*"), *client.scan_iter("unacked*")]
        if keys:
            client.delete(*keys)
        client.close()
    else:
        queue = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        for message in queue.glob("*.msg"):
            message.unlink(missing_ok=True)


class Cluster:
    """Worker and beat processes for one test; each in its own process group so a
    SIGKILL takes the worker's pool children with it, as a machine crash would."""

    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.started: dict[str, dict[str, Any]] = {}
        self.exits: dict[str, list[int]] = {}

    def env(self, **extra: str) -> dict[str, str]:
        # A test on its own database (the embedded SQLite default) names it in `extra`.
        env = {**os.environ, **FAST, "DATABASE_URL": extra.get("DATABASE_URL") or worker_database_url()}
        if self.redis_url:
            env["REDIS_URL"] = self.redis_url
        else:
            env.pop("REDIS_URL", None)
        return {**env, **extra}

    def start_worker(
        self, name: str, *, concurrency: int | None = None, pool: str = "threads", **extra: str
    ) -> subprocess.Popen[bytes]:
        """A worker as deployed: the threads pool and its default concurrency, unless
        the test asks otherwise. The pool goes through AIRLOCK_WORKER_POOL because
        Celery replaces `--pool prefork` with the configured pool."""
        self.started[name] = {"concurrency": concurrency, "pool": pool, **extra}
        extra = {"AIRLOCK_WORKER_POOL": pool, **extra}
        argv = worker_argv(hostname=f"{name}-{uuid.uuid4().hex[:6]}@%h", concurrency=concurrency, heartbeat=False)
        proc = self._spawn(name, argv, self.env(**extra))
        wait_for(lambda: "ready." in self.log(name) or proc.poll() is not None, timeout=60, what=f"{name} ready")
        assert proc.poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
        return proc

    def supervise(self, name: str) -> None:
        """Start worker `name` again, as it was started, if it died, the way a supervisor
        (compose's restart policy) does; its exit codes are kept in `exits[name]`. A
        threaded worker that meets a crash point or a poison tool dies whole."""
        code = self.procs[name].poll()
        if code is not None:
            self.exits.setdefault(name, []).append(code)
            self.start_worker(name, **self.started[name])

    def start_beat(self, **extra: str) -> subprocess.Popen[bytes]:
        argv = beat_argv(schedule=self.tmp / f"beat-{uuid.uuid4().hex[:6]}")
        return self._spawn("beat", argv, self.env(**extra))

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} already runs"
        log = self.tmp / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, cwd=BASE, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[name], self.logs[name] = proc, log
        return proc

    def log(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def kill(self, name: str) -> None:
        """SIGKILL the whole worker (main process and pool), then reap it."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)


@pytest.fixture
def broker_url() -> str:
    return os.environ.get("REDIS_URL", "")


@pytest.fixture
def cluster(transactional_db: None, defaults: None, tmp_path: Path, broker_url: str) -> Iterator[Cluster]:
    purge_broker(broker_url)
    c = Cluster(tmp_path, broker_url)
    try:
        yield c
    finally:
        c.stop_all()
        purge_broker(broker_url)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A Redis of our own on a free port, started on demand and stopped at teardown:
    the shared server is never stopped."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed"
        procs.append(
            subprocess.Popen(
                [
                    server,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(tmp_path),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

        wait_for(lambda: listening(port), timeout=20, what="private redis-server")
        return url

    url = f"redis://127.0.0.1:{port}/0"
    start.url = url  # type: ignore[attr-defined]
    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=20)
