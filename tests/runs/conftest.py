"""Personas for the run pages: one user per group, plus a stranger with no group."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import person


@pytest.fixture
def launcher(defaults: None) -> User:
    return person("lena", "launcher")


@pytest.fixture
def other_launcher(defaults: None) -> User:
    return person("lars", "launcher")


@pytest.fixture
def operator(defaults: None) -> User:
    return person("olga", "operator")


@pytest.fixture
def reviewer(defaults: None) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def stranger(defaults: None) -> User:
    return person("sam")


def client_for(user: User, *, csrf: bool = True) -> Client:
    """A logged-in client that enforces CSRF, as a browser would meet it."""
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def csrf_post(client: Client, url: str, data: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """POST with the CSRF token the page handed out, the way the form does."""
    client.get("/runs/")
    token = client.cookies["csrftoken"].value
    return client.post(url, {**(data or {}), "csrfmiddlewaretoken": token}, **kwargs)
