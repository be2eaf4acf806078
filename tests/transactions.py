"""Which tests need a real commit, and a check that a tool never writes into a test's
transaction from another thread (a plugin of tests/conftest.py).

A test marked `django_db` runs inside one transaction that is rolled back at its end;
`django_db(transaction=True)` commits for real and flushes the database after the test
(a few tenths of a second a test on SQLite). The flush is only for tests that need
what a transaction cannot give: another thread or process reading the test's rows, a
`select_for_update` race, an on-commit hook that must run after a real commit. A test
that only needs on-commit callbacks to run uses `django_capture_on_commit_callbacks(
execute=True)` inside the transaction.

The check: the driver runs tools on a helper thread with its own database connection
(`agents/runs/driver.py`, `DjangoRunner`). Inside a test's transaction that connection
cannot see the test's rows, and on SQLite its write waits out the 20-second busy
timeout for the test's own write lock before failing: the tool's error became the
run's result, and the test passed on a run that never wrote. So in a test without a
real commit, a tool thread that touches the database fails the test at once, naming
the fix.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from pytest_django.fixtures import validate_django_db

# What a tool thread ran inside a test's transaction, by the test's node id.
_used: dict[str, list[str]] = {}


def transactional(item: pytest.Item) -> bool:
    """Whether pytest-django gives `item` a real commit (its rule, in `_django_db_helper`)."""
    names = getattr(item, "fixturenames", ())
    if "transactional_db" in names or "live_server" in names:
        return True
    marker = item.get_closest_marker("django_db")
    return bool(marker and validate_django_db(marker)[0])  # (transaction, reset_sequences, ...)


@pytest.fixture(autouse=True)
def _no_tool_thread_in_the_tests_transaction(request: pytest.FixtureRequest) -> Generator[None]:
    item = request.node
    if transactional(item) or not ("db" in item.fixturenames or item.get_closest_marker("django_db")):
        yield
        return
    from django.db import connection

    from agents.runs.driver import DjangoRunner

    original = DjangoRunner.call

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        _used.setdefault(item.nodeid, []).append(sql[:80])
        raise RuntimeError("a tool thread used the database inside a test's transaction (tests/transactions.py)")

    def call(self: DjangoRunner, spec: Any, args: dict[str, Any], ctx: Any) -> Any:
        # On the tool's thread: `connection` is that thread's own.
        with connection.execute_wrapper(refuse):
            return original(self, spec, args, ctx)

    DjangoRunner.call = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        DjangoRunner.call = original  # type: ignore[method-assign]
    used = _used.pop(item.nodeid, [])
    if used:
        pytest.fail(
            f"a tool on the driver's thread used the database ({used[0]!r}) inside the test's transaction, "
            "where it cannot see the test's rows and, on SQLite, waits for the test's own write lock: "
            "mark the test django_db(transaction=True) (tests/transactions.py)",
            pytrace=False,
        )
