"""Runs that wait, and how to watch them: what the concurrency bench and the worker
tests share.

`SlowProvider` is an OpenAI-compatible model provider on loopback: Chat Completions
answered after a fixed delay over real HTTP, so a benchmark or a test waits the way
production waits on a real model. `Sampler` watches the database while runs go: how
many of them workers hold at once, and how many database sessions are open.

It decides from the request alone, so any number of runs can share one server: a run
whose transcript holds `turn` assistant messages gets a call of `tool` while
`turn < calls - 1`, then a final answer. Each call's arguments differ by turn (the
engine fails a run that repeats an identical call).

    python bench/waiting.py --delay 1 --calls 5    # prints its base URL

then point `OPENAI_BASE_URL` at it and launch runs of an `openai` profile.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of runs connect at once; the default backlog of 5 would drop SYNs.
    request_queue_size = 1024


class SlowProvider:
    """The server; `with SlowProvider(...) as provider:` serves on `provider.url`."""

    def __init__(self, *, delay: float, calls: int, tool: str = "sleep", tool_seconds: float = 0.0) -> None:
        if calls < 1:
            raise ValueError("a run needs at least one model call")
        self.delay = delay
        self.calls = calls
        self.tool = tool
        self.tool_seconds = tool_seconds
        self.requests = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="slow-provider", daemon=True)

    def __enter__(self) -> SlowProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def args_for(self, turn: int) -> dict[str, Any]:
        if self.tool == "sleep":
            return {"seconds": self.tool_seconds + turn / 1000}
        return {"text": f"turn {turn}"}

    def reply(self, body: Any) -> dict[str, Any]:
        messages = body.get("messages") if isinstance(body, dict) else None
        turn = sum(1 for m in messages or [] if isinstance(m, dict) and m.get("role") == "assistant")
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        if turn < self.calls - 1:
            call = {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": self.tool, "arguments": json.dumps(self.args_for(turn))},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": f"done after {turn + 1} calls"}
            finish = "stop"
        return {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "model": str(body.get("model", "slow")) if isinstance(body, dict) else "slow",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                with provider._lock:
                    provider.requests += 1
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                time.sleep(provider.delay)
                payload = json.dumps(provider.reply(body)).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class Sampler(threading.Thread):
    """Samples until stopped: how many of `ids` a worker holds (a live lease), and how
    many database sessions carry `application_name` (PostgreSQL; start the worker with
    `PGAPPNAME` set to it, which libpq reads).

    Observed in the database, not timed; `most_in_flight` and `most_connections` are
    the peaks.
    """

    def __init__(self, ids: list[int], *, application_name: str = "", every: float = 0.05) -> None:
        super().__init__(name="airlock-sampler", daemon=True)
        self.ids = ids
        self.application_name = application_name
        self.every = every
        self.stopping = threading.Event()
        self.most_in_flight = 0
        self.most_connections = 0

    def run(self) -> None:
        from django.db import connection

        from agents.models import Run

        try:
            while not self.stopping.is_set():
                held = Run.objects.filter(pk__in=self.ids, lease_owner__startswith="worker:").count()
                self.most_in_flight = max(self.most_in_flight, held)
                if self.application_name:
                    self.most_connections = max(self.most_connections, self.connections())
                self.stopping.wait(self.every)
        finally:
            connection.close()

    def connections(self) -> int:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "select count(*) from pg_stat_activity where datname = current_database() and application_name = %s",
                [self.application_name],
            )
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=1.0, help="seconds before each answer")
    parser.add_argument("--calls", type=int, default=5, help="model calls per run (the last one answers)")
    parser.add_argument("--tool", default="sleep", help="the tool each earlier call asks for (sleep or echo)")
    parser.add_argument("--tool-seconds", type=float, default=1.0, help="how long a sleep call waits")
    args = parser.parse_args()
    with SlowProvider(delay=args.delay, calls=args.calls, tool=args.tool, tool_seconds=args.tool_seconds) as provider:
        print(f"OPENAI_BASE_URL={provider.url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
