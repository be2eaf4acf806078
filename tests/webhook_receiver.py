"""A real webhook receiver on loopback that verifies every request with the Standard
Webhooks reference library (`standardwebhooks`), as a customer's endpoint would."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any

from django.core.management import call_command
from standardwebhooks import Webhook as Verifier
from standardwebhooks import WebhookVerificationError


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    payload: Any = None  # what the verifier returned; None if it refused
    refused: str = ""  # why the verifier refused it

    @property
    def msg_id(self) -> str:
        return self.headers.get("webhook-id", "")


@dataclass
class Receiver:
    """Answers each POST with the next of `statuses` (200 once they run out). With
    `hold` set, a request waits (after `arrived` is set) until `hold` is set too."""

    secret: str = ""
    statuses: deque[int] = field(default_factory=deque)
    requests: list[Received] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    hold: threading.Event | None = None
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/airlock"

    def record(self, headers: dict[str, str], body: bytes) -> int:
        got = Received(headers, body)
        try:
            got.payload = Verifier(self.secret).verify(body, headers)
        except WebhookVerificationError as exc:
            got.refused = str(exc)
        self.requests.append(got)
        self.arrived.set()
        if self.hold is not None:
            self.hold.wait(timeout=60)
        return self.statuses.popleft() if self.statuses else 200

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver.record({k.lower(): v for k, v in self.headers.items()}, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def types(self) -> list[str]:
        return [json.loads(r.body).get("type", "") for r in self.requests]


def add_webhook(url: str, events: str, *args: str) -> str:
    """`manage.py add_webhook`, returning the secret it printed as its last line."""
    out = StringIO()
    call_command("add_webhook", url, "--events", events, *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]
