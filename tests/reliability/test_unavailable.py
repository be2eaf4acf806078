"""A database error met outside a view (in a middleware) is still a 503, not a 500.

The real outage (a PostgreSQL restart) is test_database_restart.py; this covers the
handler500 path, which that test cannot aim at: the session middleware failing.
"""

from __future__ import annotations

import pytest
from django.contrib.sessions.middleware import SessionMiddleware
from django.db import OperationalError
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def session_store_down(monkeypatch) -> None:
    def refuse(self, request) -> None:
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(SessionMiddleware, "process_request", refuse)


@pytest.mark.parametrize("path", ["/", "/runs/", "/reviews/"])
def test_a_page_answers_a_plain_503(session_store_down, path: str) -> None:
    answer = Client(raise_request_exception=False).get(path)
    assert answer.status_code == 503 and answer["Retry-After"]
    assert answer["Content-Type"].startswith("text/plain")
    assert b"database is unavailable" in answer.content and b"<html" not in answer.content.lower()


def test_the_api_answers_a_json_503(session_store_down) -> None:
    answer = Client(raise_request_exception=False).get("/api/runs/1", HTTP_AUTHORIZATION="Bearer x")
    assert answer.status_code == 503
    assert answer.json() == {"error": "unavailable", "detail": "the database is unavailable; try again in a few seconds"}


def test_other_errors_still_get_the_500_page(monkeypatch) -> None:
    def broken(self, request) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(SessionMiddleware, "process_request", broken)
    assert Client(raise_request_exception=False).get("/runs/").status_code == 500
