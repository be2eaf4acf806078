"""Importing the bench's modules leaves the process's environment alone: tests import
its helpers, and their processes (and the commands those start, such as `check
--deploy`) must keep the test run's database, not `make bench`'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_MODULES = ["bench.run", "bench.gateway", "bench.batch", "bench.retention", "bench.history", "bench.stats",
                 "bench.caching", "bench.workers", "bench.waiting"]


@pytest.mark.process
def test_importing_the_bench_sets_no_database_or_broker() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "AIRLOCK_ALLOW_SCRIPTED")}
    code = (
        "import importlib, json, os, sys\n"
        f"for name in {BENCH_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({k: os.environ.get(k) for k in ('DATABASE_URL', 'REDIS_URL', 'AIRLOCK_ALLOW_SCRIPTED')}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"DATABASE_URL": None, "REDIS_URL": None,
                                                           "AIRLOCK_ALLOW_SCRIPTED": None}
