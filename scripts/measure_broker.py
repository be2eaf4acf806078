"""Wake-ups through the embedded default's broker candidates (issue 25): kombu's stock
filesystem transport, Airlock's fixed one (config/fsbroker.py, `airlockfs://`) and
kombu's SQLAlchemy transport on a SQLite file. Not part of `make bench`.

    python scripts/measure_broker.py [--producers 3] [--messages 300] [--rate 20]

For each transport: a burst (PRODUCERS processes publish MESSAGES each as fast as they
can while one consumer drains, as a worker does: kombu's drain_events, polling every
0.1 s) gives wake-ups per second and how many were lost or failed; a paced stream
(RATE per second for 5 s, one producer) gives the latency from publish to delivery
(p50/p95/max). The SQLAlchemy transport needs SQLAlchemy (not a dependency: put it on
PYTHONPATH, e.g. `pip install --target /tmp/sqla 'sqlalchemy>=2,<3'`). Prints one JSON
line per transport.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))


def connection(kind: str, root: Path) -> Any:
    from kombu import Connection

    from config import fsbroker

    if kind == "sqlalchemy":
        # Its transport options go to create_engine(): the polling interval is set apart.
        conn = Connection(f"sqla+sqlite:///{root / 'broker.sqlite3'}")
        conn.transport.polling_interval = 0.1
        return conn
    folders = {"data_folder_in": str(root / "q"), "data_folder_out": str(root / "q"), "control_folder": str(root / "c")}
    for folder in ("q", "c"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    options = {**folders, "polling_interval": 0.1, "bad_folder": str(root / "bad")}
    if kind == "airlockfs":
        return Connection(transport=fsbroker.Transport, transport_options=options)
    return Connection("filesystem://", transport_options=options)


def produce(kind: str, root: str, name: str, count: int, rate: float) -> None:
    with connection(kind, Path(root)) as conn:
        q = conn.SimpleQueue("wake")
        for i in range(count):
            q.put({"id": f"{name}-{i}", "sent": time.time()})
            if rate:
                time.sleep(1 / rate)


def consume(kind: str, root: str, expected: int, out: Any, idle_seconds: float) -> None:
    from kombu import Consumer, Exchange, Queue

    got: dict[str, float] = {}
    error = None
    with connection(kind, Path(root)) as conn:
        queue = Queue("wake", Exchange("wake"), routing_key="wake")

        def on_message(body: dict[str, Any], message: Any) -> None:
            got[body["id"]] = time.time() - body["sent"]
            message.ack()

        with Consumer(conn, [queue], callbacks=[on_message], accept=["json"]):
            last = time.monotonic()
            while len(got) < expected and time.monotonic() - last < idle_seconds:
                before = len(got)
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    pass
                except Exception as exc:  # noqa: BLE001 - what killed Celery's consumer, counted
                    error = f"{type(exc).__name__}: {exc}"[:200]
                    break
                if len(got) > before:
                    last = time.monotonic()
    out.put({"got": got, "error": error, "end": time.time()})


def trial(kind: str, producers: int, messages: int, rate: float) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix=f"broker-{kind}-")
    with connection(kind, Path(root)) as conn:
        conn.SimpleQueue("wake").queue.declare()  # the consumer's queue exists before the first put
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    expected = producers * messages
    consumer = ctx.Process(target=consume, args=(kind, root, expected, out, 5.0))
    consumer.start()
    time.sleep(1.0)  # let the consumer start polling
    start = time.time()
    procs = [ctx.Process(target=produce, args=(kind, root, f"p{n}", messages, rate)) for n in range(producers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    result = out.get(timeout=600)
    consumer.join()
    latencies = sorted(result["got"].values())
    elapsed = result["end"] - start if latencies else 0.0

    def pct(q: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1) if latencies else -1

    return {
        "delivered": len(latencies), "lost": expected - len(latencies), "consumer_error": result["error"],
        "per_second": round(len(latencies) / elapsed, 1) if elapsed else 0,
        "latency_ms": {"p50": pct(0.5), "p95": pct(0.95), "max": pct(0.999999)},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--transports", default="filesystem,airlockfs,sqlalchemy")
    a = parser.parse_args()
    for kind in a.transports.split(","):
        if kind == "sqlalchemy":
            try:
                import sqlalchemy  # noqa: F401
            except ImportError:
                print(json.dumps({"transport": kind, "skipped": "SQLAlchemy is not installed"}))
                continue
        burst = trial(kind, a.producers, a.messages, 0)
        paced = trial(kind, 1, int(a.rate * 5), a.rate)
        print(json.dumps({"transport": kind, "burst": burst, "paced": paced}), flush=True)


if __name__ == "__main__":
    main()
