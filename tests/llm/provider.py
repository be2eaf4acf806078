"""A fake model provider: a tiny threaded HTTP server on 127.0.0.1 that answers with
queued replies in the provider's real wire format and records every request.

`check` plays the provider's own request validation: a function of the request body
that returns the provider's error reply for a request it would reject (see
`tests/llm/shapes.py`: `ollama_check`, `anthropic_check`), or None to answer normally.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # a dict or list is sent as JSON, a str as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (to provoke a read timeout)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    json: Any


class FakeProvider:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.check: Callable[[Any], Reply | None] | None = None
        # Computes a 200 reply's usage from the request (a provider's prompt cache).
        self.usage_for: Callable[[Any], dict[str, int]] | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="fake-provider", daemon=True)

    def add(self, *replies: Reply) -> FakeProvider:
        self.replies.extend(replies)
        return self

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                provider.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                rejected = provider.check(body) if provider.check is not None else None
                if rejected is not None:
                    reply = rejected
                elif provider.replies:
                    reply = provider.replies.popleft()
                else:
                    reply = Reply(500, {"error": {"message": "no reply queued"}})
                if reply.delay:
                    time.sleep(reply.delay)
                answer = reply.body
                if provider.usage_for is not None and isinstance(answer, dict) and "usage" in answer:
                    answer = {**answer, "usage": {**answer["usage"], **provider.usage_for(body)}}
                data = answer if isinstance(answer, str) else json.dumps(answer)
                payload = data.encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a read timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _serve() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        fake.thread.join(timeout=5)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from _serve()


@pytest.fixture
def second_provider() -> Iterator[FakeProvider]:
    """Another endpoint, for profiles that each name their own base URL."""
    yield from _serve()


OPENAI_KEY = "sk-test-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-api03-test-0123456789"


@pytest.fixture
def openai_env(provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, settings: Any) -> FakeProvider:
    """The fake server as the deployment's OpenAI endpoint, with a key, no back-off sleeps."""
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    settings.AIRLOCK_LLM_BACKOFF = 0.0
    return provider


@pytest.fixture
def anthropic_env(provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, settings: Any) -> FakeProvider:
    """The fake server as the deployment's Anthropic endpoint, checking requests as the API does."""
    from tests.llm.shapes import anthropic_check

    monkeypatch.setenv("ANTHROPIC_BASE_URL", provider.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    settings.AIRLOCK_LLM_BACKOFF = 0.0
    provider.check = anthropic_check
    return provider


class Sleeps(list[float]):
    """Records the back-off sleeps instead of sleeping: fast tests that still check them."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()
