"""Private servers for the outage tests: a PostgreSQL cluster and a web server of our
own, so stopping them never touches what other test runs share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from tests.helpers import free_port, listening, wait_for
from tests.workers.cluster import BASE, Cluster


def _pg_bin() -> Path:
    """AIRLOCK_PG_BIN, else the newest Debian/Ubuntu server install, else the PATH."""
    if os.environ.get("AIRLOCK_PG_BIN"):
        return Path(os.environ["AIRLOCK_PG_BIN"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


def pg_bin_available() -> bool:
    return (PG_BIN / "initdb").exists()


class PrivatePostgres:
    """A throw-away PostgreSQL cluster on a free loopback port (trust auth, no fsync).

    As root, the server programs run as the `postgres` user, which owns the data dir.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="airlock-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/airlock"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")

    def _bin(self, name: str) -> str:
        path = PG_BIN / name
        return str(path) if path.exists() else (shutil.which(name) or name)

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check, cwd=self.dir)

    def init(self) -> None:
        self._run(self._bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        self.start()
        self._run(self._bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "airlock")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-o", opts, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=airlock") as conn:
            return list(conn.execute(sql, params).fetchall())

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def manage(env: dict[str, str], *args: str, code: str | None = None) -> str:
    argv = [sys.executable, "-c", code] if code else [sys.executable, "manage.py", *args]
    done = subprocess.run(argv, cwd=BASE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


SUPERUSER = """
import django
django.setup()
from django.contrib.auth.models import User
from agents.actions.tokens import token_create
user = User.objects.create_superuser("ops", "ops@example.com", "ops-password-123")
print(token_create(user=user)[1])
"""


def start_web(cluster: Cluster, env: dict[str, str]) -> str:
    """`manage.py runserver` (no reloader) as the app: real HTTP, real middleware."""
    port = free_port()
    cluster._spawn("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], env)

    wait_for(lambda: listening(port), timeout=60, what="the web server")
    return f"http://127.0.0.1:{port}"


def login(base: str, username: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=10)
    client.get("/login/")
    token = client.cookies["csrftoken"]
    answer = client.post(
        "/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{base}/login/"},
    )
    assert answer.status_code == 302, answer.text[:500]
    return client


class RedisServer:
    """A redis-server of our own on a free loopback port: the shared one is never
    stopped or flushed."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed"
        argv = [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.tmp)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        wait_for(lambda: listening(self.port), timeout=20, what="private redis-server")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

    def flushall(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()
