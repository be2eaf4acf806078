"""The gateway bench's CPU meter counts a process's threads that ended, not only the
ones alive when it reads: uvicorn runs each request to a synchronous Django view on a
thread that ends with the request, and the decision API's CPU there read less than
half of what the process spent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from bench.gateway import CpuMeter

# A child that, each time it reads "new" (or "same"), burns BURN seconds of CPU on a
# new thread, which then ends (or on one thread that lives on), then says so.
BURN = 0.3
CHILD = textwrap.dedent(f"""
    import queue, sys, threading, time

    def burn():
        start = time.thread_time()
        while time.thread_time() - start < {BURN}:
            pass

    jobs, done = queue.SimpleQueue(), queue.SimpleQueue()

    def lives_on():
        while True:
            jobs.get()
            burn()
            done.put(None)

    threading.Thread(target=lives_on, daemon=True).start()
    for line in sys.stdin:
        if line.strip() == "new":
            thread = threading.Thread(target=burn)
            thread.start()
            thread.join()
        else:
            jobs.put(None)
            done.get()
        print("burned", flush=True)
""")


def _metered(how: str) -> float:
    """What the meter reads over two windows, each of one BURN of the child's."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write("same\n")  # the child is up, its interpreter's start behind it
        child.stdin.flush()
        assert child.stdout.readline().strip() == "burned"
        meter = CpuMeter(child=child.pid)
        for _ in range(2):
            meter.start()
            child.stdin.write(f"{how}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "burned"
            meter.stop()
        return meter.used["child"]
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.process
def test_threads_that_ended_in_the_windows_count() -> None:
    # Both gone by the meter's reads: clock ticks (10 ms) count them, so a little less
    # than the whole may show.
    assert _metered("new") >= 2 * BURN - 0.05


@pytest.mark.process
def test_a_thread_that_lives_on_counts_once() -> None:
    # To the nanosecond, and not again in ticks: the main thread's reading and writing
    # of a line is all there is besides.
    assert 2 * BURN <= _metered("same") <= 2 * BURN + 0.04
