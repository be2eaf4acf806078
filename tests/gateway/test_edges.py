"""The wire's edges: a browser page of another origin gets 403 before anything is read
or run (the MCP specification's guard against DNS rebinding), the deployment's own
origin and the listed ones pass, and `serverInfo.version` is the package's."""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import AgentProfile, GatewaySession
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pytest", "version": "1"}}}


@pytest.fixture
def raw(defaults: None, lena: User) -> str:
    AgentProfile.objects.create(name="ext", provider="external", tools=["echo"])
    return token_create(user=lena)[1]


def post(raw: str, **headers: str) -> Any:
    return Client().post("/mcp/ext/", data=json.dumps(INIT), content_type="application/json",
                         HTTP_ACCEPT="application/json, text/event-stream", HTTP_AUTHORIZATION=f"Bearer {raw}",
                         **headers)


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:8001", "file://"])
def test_a_foreign_origin_is_403_and_opens_nothing(raw: str, settings: Any, origin: str) -> None:
    settings.AIRLOCK_BASE_URL = "http://127.0.0.1:8000"
    settings.AIRLOCK_GATEWAY_ALLOWED_ORIGINS = ["https://inspector.internal:6274"]
    refused = post(raw, HTTP_ORIGIN=origin)
    assert refused.status_code == 403, refused.content
    assert refused.json()["error"] == "forbidden_origin"
    assert not GatewaySession.objects.exists()


@pytest.mark.parametrize("origin", [None, "http://127.0.0.1:8000", "HTTP://127.0.0.1:8000/",
                                    "https://inspector.internal:6274"])
def test_no_origin_the_deployments_own_and_a_listed_one_are_served(raw: str, settings: Any,
                                                                    origin: str | None) -> None:
    settings.AIRLOCK_BASE_URL = "http://127.0.0.1:8000"
    settings.AIRLOCK_GATEWAY_ALLOWED_ORIGINS = ["https://inspector.internal:6274"]
    opened = post(raw, **({"HTTP_ORIGIN": origin} if origin else {}))
    assert opened.status_code == 200, opened.content


def test_the_default_port_is_the_same_origin(raw: str, settings: Any) -> None:
    settings.AIRLOCK_BASE_URL = "https://airlock.example.com"
    assert post(raw, HTTP_ORIGIN="https://airlock.example.com:443").status_code == 200
    assert post(raw, HTTP_ORIGIN="http://airlock.example.com").status_code == 403


def test_server_info_carries_the_packages_version(raw: str) -> None:
    info = post(raw).json()["result"]["serverInfo"]
    assert info["name"] == "airlock-gateway"
    assert info["version"] == importlib.metadata.version("airlock") != ""
