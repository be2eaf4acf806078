"""`make run`: the web server, a Celery worker and the beat scheduler in the foreground.

The worker is one process with a pool of threads (docs/deployment.md): dozens of runs
waiting on models and tools in flight at once.

The three run as children in their own process groups (so a worker's pool and the
dev server's reloader go with them), supervised (issue 25): a child that exits is
restarted after a back-off (1 s, doubling up to 30 s, back to 1 s once it has stayed
up a minute), with a log line each time, and the others carry on: a dead worker costs
the runs it held a lease expiry (the sweeper resumes them), never the dashboard. Only
Ctrl-C or SIGTERM stops everything.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
GRACE_SECONDS = 10.0
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
STEADY_SECONDS = 60.0  # a child up this long starts its back-off again from BACKOFF_FIRST

from config.celery import beat_argv, worker_argv  # noqa: E402


def commands(port: str, var_dir: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "web": [py, "manage.py", "runserver", f"127.0.0.1:{port}"],
        # The pool and its size come from settings: threads, AIRLOCK_WORKER_CONCURRENCY
        # (32) runs in flight; AIRLOCK_WORKER_POOL=prefork for CPU-bound tools.
        "worker": worker_argv(hostname="airlock-worker@%h"),
        "beat": beat_argv(schedule=var_dir / "celerybeat-schedule"),
    }


def port_taken(port: str) -> str | None:
    """Why the web server could not listen on 127.0.0.1:`port`, or None when it can.
    Bound the way runserver binds (SO_REUSEADDR), so a port in TIME_WAIT is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"port {port} is already in use (another `make run`?); nothing started: "
                    f"stop that one, or choose another port: PORT={int(port) + 1} make run"
                )
            return f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); nothing started"
    return None


def answers(port: str) -> bool:
    """Whether the web server answers HTTP yet (any status: it is serving)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def check_port() -> int:
    """`make run`'s first step, before migrate and seed: one line and exit 1 if busy."""
    problem = port_taken(os.environ.get("PORT", "8000"))
    if problem:
        say(problem, error=True)
        return 1
    return 0


def main() -> int:
    port = os.environ.get("PORT", "8000")
    # Checked again here, just before the children start (the Makefile checked before
    # migrating): a second `make run` must not attach a worker and a beat to the broker.
    problem = port_taken(port)
    if problem:
        say(problem, error=True)
        return 1
    var_dir = Path(os.environ.get("AIRLOCK_VAR_DIR", BASE / "var"))
    var_dir.mkdir(parents=True, exist_ok=True)
    # MALLOC_ARENA_MAX: a threaded worker's memory stays flat (docs/deployment.md).
    env = {"MALLOC_ARENA_MAX": "2", **os.environ, "PYTHONUNBUFFERED": "1"}
    argvs = commands(port, var_dir)
    children: dict[str, subprocess.Popen[bytes]] = {}
    started: dict[str, float] = {}
    restart_at: dict[str, float] = {}  # children waiting out their back-off
    backoff = dict.fromkeys(argvs, BACKOFF_FIRST)
    stopping = False

    def stop(signum: int | None = None, frame: object = None) -> None:
        nonlocal stopping
        if stopping and signum is not None:
            # A second Ctrl-C: do not wait for warm shutdown. Runs survive a kill
            # (leases expire, the sweeper resumes them).
            for child in children.values():
                _signal_group(child, signal.SIGKILL)
            return
        stopping = True

    def start(name: str) -> None:
        children[name] = subprocess.Popen(argvs[name], cwd=BASE, env=env, start_new_session=True)
        started[name] = time.monotonic()
        say(f"{name} started (pid {children[name].pid})")

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for name in argvs:
        start(name)
    # "web on" only once it answers: the dev server takes seconds to import and bind,
    # and a line saying it serves before it does sends people to a refused connection.
    announced = False
    while not stopping:
        if not announced and children["web"].poll() is None and answers(port):
            announced = True
            say(f"web on http://127.0.0.1:{port}/ with a worker and the scheduler (pid {os.getpid()}); Ctrl-C stops all")
        now = time.monotonic()
        for name, child in children.items():
            if name in restart_at:
                continue
            code = child.poll()
            if code is None:
                continue
            # Whatever the dead child left in its group (a prefork pool, the dev
            # server's inner process holding the port) goes before a new one starts.
            _signal_group(child, signal.SIGKILL)
            if now - started[name] >= STEADY_SECONDS:
                backoff[name] = BACKOFF_FIRST
            delay = backoff[name]
            backoff[name] = min(BACKOFF_MAX, delay * 2)
            restart_at[name] = now + delay
            say(f"{name} (pid {child.pid}) exited with {code}; restarting it in {delay:g} s", error=True)
        for name, when in list(restart_at.items()):
            if now >= when and not stopping:
                del restart_at[name]
                start(name)
        time.sleep(0.2)
    for name, child in children.items():
        if child.poll() is None:
            if name == "web":
                _signal_group(child, signal.SIGTERM)  # the reloader and its server child
            else:
                # Celery's main process only: a warm shutdown lets its pool finish the
                # task in hand, which a group-wide SIGTERM would kill mid-step.
                child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for child in children.values():
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left in the group (a straggler, an orphaned child) goes now.
        _signal_group(child, signal.SIGKILL)
        child.wait()
    say("stopped")
    return 0


def say(line: str, *, error: bool = False) -> None:
    print(f"airlock: {line}", file=sys.stderr if error else sys.stdout, flush=True)


def _signal_group(child: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(check_port() if sys.argv[1:] == ["--check-port"] else main())
