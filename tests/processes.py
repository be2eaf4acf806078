"""Which tests start a process, a server or a browser, and a check that they say so
(a plugin of tests/conftest.py).

`make check` runs the suite without them (`-m "not process"`), in parallel; `make test`
and CI run everything. A test that starts something must carry a marker that says so:
`process` (a subprocess or a server listening on loopback), `e2e` (Chromium, which is a
process) or `worker` (real Celery workers). `e2e` and `worker` imply `process`.

The check: while a test (or a fixture it set up) runs, `subprocess.Popen`,
`multiprocessing`'s `Process.start` and `socket.listen` note the test if it carries none
of these markers, and the test fails with the note. It notes instead of raising: a
server started in a thread would swallow the exception and leave its test waiting.
"""

from __future__ import annotations

import multiprocessing.process
import socket
import subprocess
from collections.abc import Generator
from typing import Any

import pytest

MARKERS = ("process", "e2e", "worker")

# Fixtures that start a server (or a process) for the test that asks for them: a test
# using one is marked `process` at collection, so the marker lives with the fixture's
# name here rather than on every test. The check below still catches one not listed.
PROCESS_FIXTURES = frozenset({
    "receiver",  # tests/conftest.py (a Standard Webhooks receiver), and the OTLP and Slack ones
    "receivers",  # tests/teams/test_notifications.py
    "smtp",  # tests/notifications/test_email_links.py: aiosmtpd on loopback
    "live_server",  # pytest-django's threaded server
    "provider",  # tests/llm/provider.py: the fake model provider on loopback
    "oidc_provider", "sso",  # tests/accounts/provider.py: an OpenID Provider on loopback
    "peers",  # tests/security/test_slow_peers.py: servers that trickle their answers
    "wide_server",  # tests/security/conftest.py: the app on a loopback port
    "upstream", "suite_upstream",  # tests/gateway/conftest.py: an MCP upstream, web processes
    "stdio_server", "http", "http_server",  # tests/mcp/conftest.py: MCP servers
    "gunicorn",  # tests/external/test_web_server.py
    "cluster", "private_redis",  # tests/workers/cluster.py: Celery workers, a Redis of their own
    "browser",  # tests/e2e/browser.py: Chromium
    "own_redis", "postgres",  # tests/reliability: servers the test stops and starts
})

_current: pytest.Item | None = None
_started: dict[str, list[str]] = {}

# Tests that start one themselves (a subprocess, a loopback server in the test body),
# by node id, or a whole file: found by the check below, listed here so their files
# keep the shape their authors gave them.
PROCESS_TESTS = frozenset({
    "tests/demo/test_tools.py::test_get_connects_to_the_checked_address_with_the_real_host_name",
    "tests/external/test_client_package.py",
    "tests/llm/test_endpoints.py::test_a_profile_cannot_send_another_secret_as_its_key",
    "tests/llm/test_endpoints.py::test_a_profile_whose_key_variable_is_unset_fails_naming_the_variable",
    "tests/mcp/test_card.py",
    "tests/mcp/test_hostile_listings.py",
    "tests/mcp/test_runs.py",
    "tests/mcp/test_sync.py",
    "tests/reliability/test_deploy_check.py::test_check_deploy_passes_with_production_settings",
    "tests/reviews/test_reviewer_groups.py::"
    "test_a_slack_click_by_another_group_decides_nothing_and_the_backup_after_escalation_does",
    "tests/runs/test_retention_sqlite.py::test_purge_then_verify_on_sqlite",
    "tests/test_skips.py",
    "tests/test_types.py",
    "tests/workers/test_filesystem_broker.py::test_producers_and_consumers_racing_lose_and_duplicate_nothing",
})


def listed(nodeid: str) -> bool:
    base = nodeid.split("[", 1)[0]
    return base in PROCESS_TESTS or base.split("::", 1)[0] in PROCESS_TESTS


def allowed(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in MARKERS)


def _note(what: str) -> None:
    item = _current
    if item is not None and not allowed(item):
        _started.setdefault(item.nodeid, []).append(what)


def _wrap(owner: Any, attribute: str, describe: Any) -> None:
    original = getattr(owner, attribute)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        _note(describe(self, args))
        return original(self, *args, **kwargs)

    setattr(owner, attribute, wrapper)


def pytest_configure(config: pytest.Config) -> None:
    # Patched once, on this process only: xdist starts its workers before any test
    # runs (no current test, nothing noted), and each worker loads this plugin itself.
    _wrap(subprocess.Popen, "__init__", lambda _self, args: f"a process: {str(args[0] if args else '?')[:120]}")
    _wrap(multiprocessing.process.BaseProcess, "start", lambda proc, _args: f"a process: {proc!r}")
    _wrap(socket.socket, "listen", lambda sock, _args: f"a server listening on {sock.getsockname()!r}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("process"):
            continue
        if allowed(item) or listed(item.nodeid) or PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker("process")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    global _current
    _current = item
    try:
        return (yield)
    finally:
        _current = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    started = _started.get(item.nodeid)
    if started and report.passed and call.when in ("call", "teardown"):
        _started.pop(item.nodeid)
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {', '.join(sorted(set(started)))} without a marker that says so: "
            f"mark it {' or '.join(MARKERS)} (tests/processes.py), so `make check` leaves it to `make test`"
        )
    return report
