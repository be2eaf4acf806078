"""The security tests' own fixtures: an API token per persona, and a live server that
takes a burst of simultaneous clients. Personas and `pending` are the suite's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.servers.basehttp import ThreadedWSGIServer
from django.test.testcases import LiveServerThread

from agents.actions.tokens import token_create


@pytest.fixture
def tokens(people: dict[str, User]) -> dict[str, str]:
    return {role: token_create(user=user)[1] for role, user in people.items()}


class WideServer(ThreadedWSGIServer):
    # Fifty clients connect in the same instant; with Django's listen backlog of 10 the
    # kernel resets the overflow before the server can accept it (gunicorn uses 2048).
    request_queue_size = 256


class WideServerThread(LiveServerThread):
    server_class = WideServer


@pytest.fixture
def wide_server(transactional_db: None) -> Iterator[str]:
    """Django's threaded live server (a thread and a connection per request, closed after
    it), with a listen backlog wide enough for a burst of simultaneous clients."""
    thread = WideServerThread("127.0.0.1", StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    try:
        yield f"http://127.0.0.1:{thread.port}"
    finally:
        thread.terminate()
