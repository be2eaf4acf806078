"""`make run`: the web server, a Celery worker and the beat scheduler in the foreground.

The worker is one process with a pool of threads (docs/deployment.md): dozens of runs
waiting on models and tools in flight at once.

The three run as children in their own process groups (so a worker's pool and the
dev server's reloader go with them). Ctrl-C or SIGTERM stops all three; if one of them
dies, the others are stopped too, so nothing half-works in the background.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
GRACE_SECONDS = 10.0

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


def main() -> int:
    port = os.environ.get("PORT", "8000")
    var_dir = Path(os.environ.get("AIRLOCK_VAR_DIR", BASE / "var"))
    var_dir.mkdir(parents=True, exist_ok=True)
    # MALLOC_ARENA_MAX: a threaded worker's memory stays flat (docs/deployment.md).
    env = {"MALLOC_ARENA_MAX": "2", **os.environ, "PYTHONUNBUFFERED": "1"}
    children: dict[str, subprocess.Popen[bytes]] = {}
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

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for name, argv in commands(port, var_dir).items():
        children[name] = subprocess.Popen(argv, cwd=BASE, env=env, start_new_session=True)
    print(f"airlock: web on http://127.0.0.1:{port}/ with a worker and the scheduler; Ctrl-C stops all", flush=True)
    exit_code = 0
    while not stopping:
        for name, child in children.items():
            code = child.poll()
            if code is not None:
                print(f"airlock: {name} exited with {code}; stopping the others", file=sys.stderr, flush=True)
                exit_code = code or 1
                stopping = True
                break
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
    return exit_code


def _signal_group(child: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
