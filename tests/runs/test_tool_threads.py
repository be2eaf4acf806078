"""The driver's tool thread goes back to the process when the drive ends: the next drive
reuses it (starting a thread costs more than a quick tool), a few are kept idle, and
none piles up (a long-lived worker runs thousands of drives; a thread left behind by
each one was a leak of threads and memory)."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import call, final

pytestmark = pytest.mark.django_db(transaction=True)


def tool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "airlock-tool" and t.is_alive())


def test_drives_reuse_their_tool_threads_and_leave_no_pile_behind(launch, drive) -> None:
    from agents.engine import protocols

    before = tool_threads()
    counts, parked = [], []
    for i in range(6):
        run = drive(launch([call("echo", text=f"call {i}"), call("echo", text="again"), final()]))
        assert run.state == "done"
        counts.append(tool_threads())
        parked.append(protocols._IDLE[-1])
    # One drive after another takes the thread the last one gave back: no new thread,
    # and none left behind beyond the few the process keeps idle.
    assert all(worker is parked[0] for worker in parked)
    assert counts == [counts[0]] * len(counts) and counts[0] <= max(before, 1)
    assert len(protocols._IDLE) <= protocols.IDLE_KEPT


def test_a_thread_that_ended_or_is_busy_is_never_handed_out() -> None:
    import threading

    from agents.engine import protocols

    ended = protocols._Worker()
    ended.abandon()
    ended._thread.join(timeout=10)  # as a parent's thread is after a fork: not alive
    protocols._IDLE.append(ended)
    taken = protocols._idle_worker()
    assert taken is not ended and taken.alive()
    protocols._park(taken)
    busy, release = protocols._Worker(), threading.Event()
    busy.submit(release.wait)
    protocols._park(busy)  # a runner closed while its tool still runs (it timed out)
    assert busy not in protocols._IDLE
    release.set()


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
