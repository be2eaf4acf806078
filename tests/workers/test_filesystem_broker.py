"""The embedded default's broker (config/fsbroker.py, `airlockfs://`) under concurrent
producers and consumers: a reader never sees half a message, an unreadable file is
set aside instead of killing the consumer, and real processes racing lose and
duplicate nothing (issue 25: the stock transport's JSONDecodeError, kombu #1551)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from kombu.transport import filesystem
from kombu.transport.virtual.base import BrokerState

from config import fsbroker

BASE = Path(__file__).resolve().parents[2]


def options(root: Path) -> dict[str, str]:
    for folder in ("queue", "control"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(root / "queue"),
        "data_folder_out": str(root / "queue"),
        "control_folder": str(root / "control"),
        "bad_folder": str(root / "bad"),
    }


def connect(root: Path) -> Connection:
    # Kombu keeps declared bindings per transport class, for the process: each test's
    # folders get a class of their own, as each process would.
    transport = type("Transport", (fsbroker.Transport,), {"global_state": BrokerState()})
    return Connection(transport=transport, transport_options=options(root))


class HalfWriter:
    """A file whose first write stops halfway until the test lets it finish: the
    moment a slow disk or a preempted writer leaves a message file half on disk."""

    def __init__(self, f: Any, halfway: threading.Event, resume: threading.Event) -> None:
        self.f, self.halfway, self.resume = f, halfway, resume

    def write(self, data: bytes) -> int:
        middle = len(data) // 2
        self.f.write(data[:middle])
        self.f.flush()
        self.halfway.set()
        assert self.resume.wait(60), "the test never let the writer finish"
        return middle + self.f.write(data[middle:])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> HalfWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def test_a_reader_never_sees_a_half_written_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    halfway, resume = threading.Event(), threading.Event()
    real_open = open

    def slow_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, mode, *args, **kwargs)
        return HalfWriter(f, halfway, resume) if "w" in mode and ".airlock.msg" in str(path) else f

    # Both the stock writer and ours open their files through the module's `open`.
    monkeypatch.setattr(filesystem, "open", slow_open, raising=False)
    monkeypatch.setattr(fsbroker, "open", slow_open, raising=False)
    with connect(tmp_path) as producer_conn, connect(tmp_path) as consumer_conn:
        producer, consumer = producer_conn.SimpleQueue("airlock"), consumer_conn.SimpleQueue("airlock")
        writer = threading.Thread(target=lambda: producer.put({"run": 7}))
        writer.start()
        try:
            assert halfway.wait(60)
            # The writer is halfway through the file: a reader passing now must see nothing.
            with pytest.raises(consumer.Empty):
                consumer.get_nowait()
        finally:
            resume.set()
            writer.join()
        message = consumer.get_nowait()
        assert message.payload == {"run": 7}
        message.ack()
        assert not (tmp_path / "bad").exists()


def test_an_unreadable_message_file_is_set_aside_and_the_next_one_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue = tmp_path / "queue"
    with connect(tmp_path) as conn:
        q = conn.SimpleQueue("airlock")
        # Sorted before anything the producer writes (names start with a clock in ms).
        (queue / "0_empty.airlock.msg").write_bytes(b"")
        (queue / "1_half.airlock.msg").write_bytes(b'{"body": "eyJydW4iOi')
        (queue / "2_not-a-message.airlock.msg").write_bytes(b'{"hello": "world"}')
        q.put({"run": 8})
        with caplog.at_level(logging.WARNING, logger="airlock.broker"):
            message = q.get_nowait()
        assert message.payload == {"run": 8}
        message.ack()
        with pytest.raises(q.Empty):
            q.get_nowait()
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == [
        "0_empty.airlock.msg", "1_half.airlock.msg", "2_not-a-message.airlock.msg",
    ]  # fmt: skip
    assert [p.name for p in queue.iterdir() if p.name != ".claimed"] == []
    warned = [r.getMessage() for r in caplog.records if r.name == "airlock.broker"]
    assert len(warned) == 3 and all("skipped unreadable message file" in w for w in warned), warned


def test_an_unreadable_exchange_table_is_treated_as_empty(tmp_path: Path) -> None:
    with connect(tmp_path) as conn:
        q = conn.SimpleQueue("airlock")
        (tmp_path / "control" / "airlock.exchange").write_bytes(b"")  # truncated, as stock kombu leaves it mid-write
        q.put({"run": 9})  # a lost wake-up at worst; the producer must not raise
        with pytest.raises(q.Empty):
            q.get_nowait()
    with connect(tmp_path) as conn:  # the next process to bind (a restarted worker) repairs it
        q = conn.SimpleQueue("airlock")
        q.put({"run": 10})
        assert q.get_nowait().payload == {"run": 10}
    table = json.loads((tmp_path / "control" / "airlock.exchange").read_text())
    assert table == [["airlock", "", "airlock"]]


PRODUCER = """
import sys
from pathlib import Path
from kombu import Connection
from config import fsbroker
from tests.workers.test_filesystem_broker import options
name, count, root = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
with Connection(transport=fsbroker.Transport, transport_options=options(root)) as conn:
    q = conn.SimpleQueue("airlock")
    for i in range(count):
        q.put({"id": f"{name}-{i}", "pad": "x" * (i % 7) * 900})
        if i % 5 == 0:
            q.queue.declare()  # producers re-bind as they start: tables rewritten under readers
"""

CONSUMER = """
import json, sys
from pathlib import Path
from kombu import Connection
from config import fsbroker
from tests.workers.test_filesystem_broker import options
root, stop = Path(sys.argv[1]), Path(sys.argv[2])
seen = []
with Connection(transport=fsbroker.Transport, transport_options=options(root)) as conn:
    q = conn.SimpleQueue("airlock")
    while True:
        try:
            m = q.get_nowait()
        except q.Empty:
            if stop.exists() and not any(p.name.endswith(".msg") for p in (root / "queue").iterdir()):
                break
            continue
        seen.append(m.payload["id"])
        m.ack()
print(json.dumps(seen))
"""


def test_producers_and_consumers_racing_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Four producer processes and two consumers polling without pause: every message
    arrives once, whole, and no consumer dies."""
    env = {**os.environ, "PYTHONPATH": str(BASE)}
    stop = tmp_path / "producers-done"
    consumers = [
        subprocess.Popen([sys.executable, "-c", CONSUMER, str(tmp_path), str(stop)], cwd=BASE, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    producers = [
        subprocess.Popen([sys.executable, "-c", PRODUCER, f"p{n}", "300", str(tmp_path)], cwd=BASE, env=env,
                         stderr=subprocess.PIPE, text=True)
        for n in range(4)
    ]  # fmt: skip
    for p in producers:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    stop.touch()
    seen: Counter[str] = Counter()
    for c in consumers:
        out, err = c.communicate(timeout=300)
        assert c.returncode == 0, err[-3000:]
        seen.update(json.loads(out))
    assert set(seen) == {f"p{n}-{i}" for n in range(4) for i in range(300)}
    assert [k for k, v in seen.items() if v > 1] == []
    assert not (tmp_path / "bad").exists()
