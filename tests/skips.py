"""Which skipped tests a run allows, from AIRLOCK_FORBID_SKIPS (a plugin of tests/conftest.py).

CI runs the suite twice (.ci/run). On PostgreSQL, with Redis and Chromium, a skipped
test hides a broken promise: `AIRLOCK_FORBID_SKIPS=1` fails the run on any skip. On the
embedded default, SQLite, a test that needs PostgreSQL's concurrency (row locks, many
writers at once) skips saying so, and nothing else may: `AIRLOCK_FORBID_SKIPS=postgresql`
fails the run on a skip whose reason does not name PostgreSQL. Unset: skips are allowed.
"""

from __future__ import annotations

import os

import pytest

MODES = ("1", "postgresql")


def mode() -> str:
    value = os.environ.get("AIRLOCK_FORBID_SKIPS", "")
    if value and value not in MODES:
        raise pytest.UsageError(f"AIRLOCK_FORBID_SKIPS must be one of {', '.join(MODES)} or unset, not {value!r}")
    return value


def refused(forbid: str, reasons: list[str]) -> list[str]:
    """The skip reasons `forbid` does not allow."""
    if forbid == "1":
        return reasons
    if forbid == "postgresql":
        return [r for r in reasons if "postgresql" not in r.lower()]
    return []


def reason_of(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return f"{report.nodeid}: {longrepr[2]}"
    return f"{report.nodeid}: {longrepr}"


def pytest_configure(config: pytest.Config) -> None:
    mode()  # a misspelt mode fails before any test runs, not after all of them


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    forbid = mode()
    if not forbid:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    bad = refused(forbid, [reason_of(r) for r in skipped])
    if bad:
        allowed = "no skip" if forbid == "1" else "only skips that name PostgreSQL"
        print(f"\nAIRLOCK_FORBID_SKIPS={forbid} ({allowed}): {len(bad)} test(s) skipped; failing the run")
        for line in bad[:20]:
            print(f"  {line}")
        session.exitstatus = 1
