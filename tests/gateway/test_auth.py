"""Who may reach the gateway: a missing or bad token is a 401 that says `Bearer`, a
profile that is not external a 404, and a session is its creator's alone. Nothing runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import AgentProfile, GatewaySession, GatewayStream, Run
from tests.helpers import requires_postgres

# The gateway's queries run on its own threads: the rows must be committed to be seen.
pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pytest", "version": "1"}}}
ACCEPT = "application/json, text/event-stream"


@pytest.fixture
def ext(defaults: None) -> AgentProfile:
    return AgentProfile.objects.create(name="ext", provider="external", tools=["echo"])


def post(client: Client, path: str, body: Any, token: str | None = None, **headers: str) -> Any:
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client.post(path, data=json.dumps(body), content_type="application/json", HTTP_ACCEPT=ACCEPT, **headers)


def test_no_token_is_401_with_a_bearer_challenge(ext: AgentProfile) -> None:
    response = post(Client(), "/mcp/ext/", INIT)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"] == "unauthenticated"
    assert not GatewaySession.objects.exists()


def test_a_wrong_token_is_401_and_says_invalid_token(ext: AgentProfile) -> None:
    response = post(Client(), "/mcp/ext/", INIT, token="not-a-token")
    assert response.status_code == 401
    assert 'error="invalid_token"' in response["WWW-Authenticate"]
    assert "not-a-token" not in response.content.decode()
    assert not GatewaySession.objects.exists()


@pytest.mark.parametrize("profile", ["nope", "scripted", "demo"])
def test_an_unknown_or_model_driven_profile_is_404(ext: AgentProfile, lena: User, profile: str) -> None:
    _t, raw = token_create(user=lena)
    response = post(Client(), f"/mcp/{profile}/", INIT, token=raw)
    assert response.status_code == 404
    assert not GatewaySession.objects.exists() and not Run.objects.exists()


def test_initialize_opens_a_session_whose_id_only_its_creator_can_use(ext: AgentProfile, lena: User,
                                                                      leo: User) -> None:
    _t, lena_token = token_create(user=lena)
    _t, leo_token = token_create(user=leo)
    opened = post(Client(), "/mcp/ext/", INIT, token=lena_token)
    assert opened.status_code == 200, opened.content
    sid = opened["Mcp-Session-Id"]
    assert GatewaySession.objects.get(session_id=sid).user == lena
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    mine = post(Client(), "/mcp/ext/", listing, token=lena_token, HTTP_MCP_SESSION_ID=sid)
    assert mine.status_code == 200 and [t["name"] for t in mine.json()["result"]["tools"]] == ["echo"]
    theirs = post(Client(), "/mcp/ext/", listing, token=leo_token, HTTP_MCP_SESSION_ID=sid)
    assert theirs.status_code == 404  # answered as an unknown session: leo learns nothing


def test_a_request_without_a_session_is_400_and_a_reviewer_may_not_drive(ext: AgentProfile, lena: User,
                                                                          rita: User) -> None:
    _t, lena_token = token_create(user=lena)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert post(Client(), "/mcp/ext/", listing, token=lena_token).status_code == 400
    _t, rita_token = token_create(user=rita)
    assert post(Client(), "/mcp/ext/", INIT, token=rita_token).status_code == 403


def test_airlock_run_continues_only_the_callers_own_run_of_that_profile(ext: AgentProfile, lena: User,
                                                                        leo: User) -> None:
    from agents.actions.runs import run_launch

    leos = run_launch(agent=ext, task="leo's", user=leo)
    _t, lena_token = token_create(user=lena)
    refused = post(Client(), "/mcp/ext/", INIT, token=lena_token, HTTP_AIRLOCK_RUN=str(leos.pk))
    assert refused.status_code == 404
    hers = run_launch(agent=ext, task="lena's", user=lena)
    accepted = post(Client(), "/mcp/ext/", INIT, token=lena_token, HTTP_AIRLOCK_RUN=str(hers.pk))
    assert accepted.status_code == 200
    assert GatewaySession.objects.get(session_id=accepted["Mcp-Session-Id"]).run == hers


def test_the_first_call_launches_the_streams_run_which_outlives_the_session(ext: AgentProfile, lena: User) -> None:
    _t, raw = token_create(user=lena)
    sid = post(Client(), "/mcp/ext/", INIT, token=raw)["Mcp-Session-Id"]
    post(Client(), "/mcp/ext/", {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, token=raw, HTTP_MCP_SESSION_ID=sid)
    assert not Run.objects.exists()  # listing tools launches nothing
    called = post(Client(), "/mcp/ext/", {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                          "params": {"name": "echo", "arguments": {"text": "hi"}}},
                  token=raw, HTTP_MCP_SESSION_ID=sid)
    assert called.json()["result"]["content"][0]["text"] == "hi"
    run = Run.objects.get()
    assert run.created_by == lena and run.state == "planning"
    assert GatewayStream.objects.get(user=lena, profile=ext, key="").run == run
    closed = Client().delete("/mcp/ext/", HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_MCP_SESSION_ID=sid)
    assert closed.status_code == 200
    run.refresh_from_db()
    # The run is the stream's, not the session's: another connection of the caller goes on in it.
    assert run.state == "planning"
    again = post(Client(), "/mcp/ext/", {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, token=raw,
                 HTTP_MCP_SESSION_ID=sid)
    assert again.status_code == 404  # a closed session is gone: the client initializes anew
