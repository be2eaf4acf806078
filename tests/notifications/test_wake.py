"""Delivery wake-ups leave from a waker thread: the committing thread never waits on
the broker, and wake-ups asked for while one is on its way fold into one more."""

from __future__ import annotations

import os
import threading
import time

import pytest

from agents import broker


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], threading.Event]:
    sent: list[float] = []
    release = threading.Event()

    def slow_send() -> None:
        release.wait(5)  # a broker that takes its time
        sent.append(time.monotonic())

    monkeypatch.setattr(broker, "_send_delivery_wake", slow_send)
    monkeypatch.setattr(broker, "_waker", broker.Waker())
    return sent, release


def wait_for(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_asking_does_not_wait_for_the_broker_and_a_burst_costs_two_sends(sends) -> None:
    sent, release = sends
    for _ in range(100):
        broker.wake_delivery()
    assert sent == []  # every ask returned while the send is still blocked
    release.set()
    wait_for(lambda: len(sent) >= 1)
    time.sleep(0.2)  # room for any further (wrong) sends
    # The first ask's send, then one for every ask that came while it was on its way.
    assert 1 <= len(sent) <= 2


def test_an_ask_after_a_send_sends_again(sends) -> None:
    sent, release = sends
    release.set()
    broker.wake_delivery()
    wait_for(lambda: len(sent) == 1)
    broker.wake_delivery()
    wait_for(lambda: len(sent) == 2)
    assert len(sent) == 2


def test_a_stream_of_asks_sends_at_most_one_wake_up_per_interval(sends, monkeypatch) -> None:
    """Runs ending one after another (a busy worker) ask for a wake-up each; the waker
    sends one per WAKE_INTERVAL_SECONDS at most, and the last ask still gets its send."""
    sent, release = sends
    release.set()
    monkeypatch.setattr(broker, "WAKE_INTERVAL_SECONDS", 0.2)
    started = time.monotonic()
    for _ in range(40):
        broker.wake_delivery()
        time.sleep(0.01)
    asked_for = time.monotonic() - started
    wait_for(lambda: sent and sent[-1] > started + asked_for)  # the send after the last ask
    # One send at the first ask, then at most one per interval; a slow machine only
    # stretches the gaps, which lowers the count.
    assert 2 <= len(sent) <= 2 + int(asked_for / 0.2)
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= 0.2


def test_a_forked_child_starts_its_own_waker(sends) -> None:
    sent, release = sends
    release.set()
    broker.wake_delivery()  # the parent's thread, which a forked child does not inherit
    wait_for(lambda: len(sent) == 1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own thread must send
        try:
            broker.wake_delivery()
            wait_for(lambda: len(sent) == 2)
            os.write(write, str(len(sent)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 10) == b"2"
