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

# A child that, each time it reads a line, burns BURN seconds of CPU on a new thread,
# which ends, then says so.
BURN = 0.3
CHILD = textwrap.dedent(f"""
    import sys, threading, time

    def burn():
        start = time.thread_time()
        while time.thread_time() - start < {BURN}:
            pass

    for _line in sys.stdin:
        thread = threading.Thread(target=burn)
        thread.start()
        thread.join()
        print("burned", flush=True)
""")


@pytest.mark.process
def test_a_thread_that_ended_in_the_window_counts() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        meter = CpuMeter(child=child.pid)
        for _ in range(2):
            meter.start()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "burned"
            meter.stop()
        # Two threads of BURN seconds each, both gone by the meter's reads; clock ticks
        # (10 ms) count them, so a little less than the whole may show.
        assert meter.used["child"] >= 2 * BURN - 0.05
    finally:
        child.kill()
        child.wait(timeout=10)
