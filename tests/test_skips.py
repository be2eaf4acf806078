"""AIRLOCK_FORBID_SKIPS as CI uses it (tests/skips.py): the PostgreSQL leg fails on any
skip, the SQLite leg on a skip whose reason does not name PostgreSQL. Each case is a
pytest of its own on a two-test file, with only the skips plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
import pytest

@pytest.mark.skipif(True, reason={reason!r})
def test_skipped():
    pass

def test_runs():
    pass
'''


def run(tmp_path: Path, forbid: str | None, reason: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_one.py").write_text(TESTS.format(reason=reason))
    env = {k: v for k, v in os.environ.items() if k not in ("AIRLOCK_FORBID_SKIPS", "PYTEST_ADDOPTS")}
    if forbid is not None:
        env["AIRLOCK_FORBID_SKIPS"] = forbid
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-p", "tests.skips",
         "-q", "-rs", str(tmp_path / "test_one.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("reason", ["needs PostgreSQL (set DATABASE_URL)", "flaky on this machine"])
def test_the_postgresql_leg_fails_on_any_skip(tmp_path: Path, reason: str) -> None:
    done = run(tmp_path, "1", reason)
    assert done.returncode == 1, done.stdout
    assert "AIRLOCK_FORBID_SKIPS=1 (no skip): 1 test(s) skipped; failing the run" in done.stdout


def test_the_sqlite_leg_allows_a_skip_that_names_postgresql(tmp_path: Path) -> None:
    done = run(tmp_path, "postgresql", "needs PostgreSQL (set DATABASE_URL)")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout


def test_the_sqlite_leg_fails_on_a_skip_for_any_other_reason(tmp_path: Path) -> None:
    done = run(tmp_path, "postgresql", "flaky on this machine")
    assert done.returncode == 1, done.stdout
    assert "only skips that name PostgreSQL" in done.stdout
    assert "test_one.py::test_skipped: Skipped: flaky on this machine" in done.stdout


def test_unset_allows_skips_and_a_misspelt_mode_is_refused_before_any_test(tmp_path: Path) -> None:
    assert run(tmp_path, None, "anything").returncode == 0
    done = run(tmp_path, "postgres", "needs PostgreSQL")
    assert done.returncode != 0 and "AIRLOCK_FORBID_SKIPS must be one of 1, postgresql" in done.stdout + done.stderr
    assert "passed" not in done.stdout
