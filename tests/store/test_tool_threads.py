"""The driver's tool thread ends with the drive: a long-lived worker runs thousands of
drives, and a thread left behind by each one was a leak of threads and memory."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import call, final

pytestmark = pytest.mark.django_db(transaction=True)


def tool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "airlock-tool" and t.is_alive())


def test_each_drive_leaves_no_tool_thread_behind(launch, drive) -> None:
    before = tool_threads()
    for i in range(5):
        run = drive(launch([call("echo", text=f"call {i}"), call("echo", text="again"), final()]))
        assert run.state == "done"
    # The thread exits once it reads the stop signal: bounded wait, not a timing assertion.
    deadline = time.monotonic() + 10
    while tool_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tool_threads() == before


def test_a_closed_runner_starts_a_fresh_thread_on_the_next_drive(launch, drive) -> None:
    from agents.models import Run
    from agents.runs import driver

    run = launch([call("echo", text="one"), call("echo", text="two"), final()])
    deps = driver.deps_for(Run.objects.select_related("profile").get(pk=run.pk))
    # Pickup, the first call, its result: the drive stops and closes the runner.
    assert drive(run, deps=deps, max_transitions=3).state == "planning"
    # The same deps again (a caller may reuse them): the closed runner still runs tools.
    assert drive(run, deps=deps).state == "done"
    assert sorted(run.tool_calls.values_list("status", flat=True)) == ["succeeded", "succeeded"]
