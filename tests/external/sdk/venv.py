"""The OpenAI Agents SDK's own virtual environment, made once per machine.

The SDK's import name is `agents`, as is Airlock's Django app: the two cannot share an
interpreter. The environment holds the SDK alone (the client comes from this checkout
on PYTHONPATH, so it is always the code under test), lives in the user's cache keyed by
its requirements, and is built under a lock into a temporary folder renamed into place, so
concurrent test sessions build it once and never see half of one."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SDK = "openai-agents>=0.24,<0.25"
# The SDK, what the client needs, and what builds the client's wheel without fetching
# anything (tests/external/test_client_package.py installs it with no build isolation).
REQUIREMENTS = (SDK, "httpx>=0.27,<1", "setuptools>=69", "wheel")
BUILD_TIMEOUT = 600  # seconds: a cold pip install of the SDK and its dependencies


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:12]
    return base / "airlock" / f"venv-openai-agents-{key}"


def python() -> Path:
    """The environment's interpreter, building the environment first if it is missing."""
    target = cache_dir()
    ready = target / ".ready"
    if ready.exists():
        return target / "bin" / "python"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / (target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session builds it: wait, then use theirs
        if not ready.exists():
            building = target.with_name(target.name + f".building-{os.getpid()}")
            shutil.rmtree(building, ignore_errors=True)
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(building)], check=True, timeout=120)
            # Only `bin/python` is used, and it finds its environment from pyvenv.cfg beside
            # it: the folder may be renamed once built.
            subprocess.run(
                [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 *REQUIREMENTS],
                check=True, timeout=BUILD_TIMEOUT,
            )
            shutil.rmtree(target, ignore_errors=True)
            building.rename(target)
            (target / ".ready").touch()
    return target / "bin" / "python"
