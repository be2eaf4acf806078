"""NUL bytes through every door (issue 46, item 4). PostgreSQL refuses NUL in text, so
a NUL that reached a query or a row was a 500 (or, at the MCP gateway, a 503 with a
traceback, and a client that could never connect). Each door now cleans text the one
way arguments and notes are cleaned (`agents.lib.sanitize.clean`: NUL becomes U+FFFD)
or answers a 4xx naming the field; never a 5xx."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import AgentProfile, ClientCall, GatewaySession, Run
from tests.helpers import requires_postgres

NUL = "a\x00b"
CLEAN = "a\ufffdb"


@pytest.fixture
def ext(defaults: None) -> AgentProfile:
    return AgentProfile.objects.create(name="ext", provider="external", tools=["echo"])


@pytest.fixture
def ext_run(api: Any, ext: AgentProfile) -> int:
    response = api("lena").post("/api/runs", {"agent": "ext", "task": "tidy the ledger"})
    assert response.status_code == 201, response.data
    return int(response.data["id"])


@pytest.mark.django_db
def test_a_tool_name_with_nul_is_cleaned_and_refused_as_an_unknown_tool_not_a_500(api, ext_run) -> None:
    """The probe: `POST /api/runs/<id>/calls` with `\\u0000` in the tool's name was a 500."""
    response = api("lena").post(f"/api/runs/{ext_run}/calls", {"tool": f"echo{NUL}", "args": {"text": NUL}})
    assert response.status_code == 400, response.data
    assert set(response.data) >= {"error", "detail"}
    assert response.data["error"] == "unknown_tool", response.data
    assert [c.tool for c in ClientCall.objects.filter(run_id=ext_run)] in ([], [f"echo{CLEAN}"])
    payloads = json.dumps(list(Run.objects.get(pk=ext_run).transitions.values_list("payload", flat=True)))
    assert "\\u0000" not in payloads
    assert "echoa\\ufffdb" in payloads
    # The run goes on: a good call is taken.
    ok = api("lena").post(f"/api/runs/{ext_run}/calls", {"tool": "echo", "args": {"text": "hi"}})
    assert ok.status_code == 200, ok.data


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/runs?q={}", "/api/runs?agent={}", "/api/runs?launched_by={}", "/api/runs?state={}",
        "/api/approvals?tool={}", "/api/approvals?q={}", "/api/runs/export?agent={}",
    ],
)
def test_a_nul_in_a_list_filter_is_never_a_500(api, lena, path) -> None:
    response = api("otto").get(path.format("a%00b"))
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])
    if response.status_code == 400:
        assert set(response.data) >= {"error", "detail"}


@pytest.mark.django_db
def test_a_hold_reason_and_a_finish_answer_with_nul_are_cleaned(api, launch, drive, ext_run) -> None:
    run = drive(launch([{"final": "done"}]))
    held = api("otto").post(f"/api/runs/{run.pk}/hold", {"reason": NUL})
    assert held.status_code in (200, 400), held.content[:300]
    if held.status_code == 200:
        assert Run.objects.get(pk=run.pk).hold_reason == CLEAN
    done = api("lena").post(f"/api/runs/{ext_run}/finish", {"answer": NUL})
    assert done.status_code == 200, done.data
    assert "\x00" not in (Run.objects.get(pk=ext_run).answer or "")


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": f"probe{NUL}", "version": "1"}}}


@requires_postgres()  # the gateway's queries run on its own threads: committed rows, and NUL is PostgreSQL's refusal
@pytest.mark.django_db(transaction=True)
def test_an_mcp_client_named_with_nul_connects(ext, lena) -> None:
    """The probe: `initialize` with `\\u0000` in `clientInfo.name` answered 503 with a
    logged traceback, and that client could never connect."""
    _t, token = token_create(user=lena)
    response = Client().post(
        "/mcp/ext/", data=json.dumps(INIT), content_type="application/json",
        HTTP_ACCEPT="application/json, text/event-stream", HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 200, response.content[:300]
    session = GatewaySession.objects.get(session_id=response["Mcp-Session-Id"])
    assert session.client_name == f"probe{CLEAN}"


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["agent", "task", "approver"])
def test_a_launch_with_nul_in_a_field_is_cleaned_or_a_400_naming_it(api, lena, field) -> None:
    body = {"agent": "scripted", "task": "a task", "script": [{"final": "hi"}], field: NUL}
    response = api("lena").post("/api/runs", body)
    assert response.status_code in (201, 400), (response.status_code, response.content[:300])
    if response.status_code == 400:
        assert field in response.data["error"] or field in json.dumps(response.data["detail"])
    else:
        assert Run.objects.get(pk=response.data["id"]).task == CLEAN


@pytest.mark.django_db
def test_a_decision_note_with_nul_is_cleaned(api, pending, rita) -> None:
    approval = pending()
    response = api("rita").post(f"/api/approvals/{approval.pk}/decision", {"decision": "reject", "note": NUL})
    assert response.status_code == 200, response.data
    approval.refresh_from_db()
    assert approval.note == CLEAN


@pytest.mark.django_db
def test_a_login_with_nul_in_the_username_is_refused_not_a_500(defaults) -> None:
    client = Client()
    client.get("/login/")
    response = client.post("/login/", {"username": NUL, "password": "x"})
    assert response.status_code in (200, 400, 403), response.status_code


@pytest.mark.django_db(transaction=True)
def test_a_slack_click_with_nul_in_its_member_id_is_logged_cleaned(settings, pending) -> None:
    """A signed click is decided in a thread: a NUL in its member id or action_ts made
    the click's log row fail to insert (a traceback, and no record of the click)."""
    import time
    import urllib.parse

    from slack_sdk.signature import SignatureVerifier

    from agents.models import SlackAction
    from agents.notifications import slack

    settings.AIRLOCK_SLACK_SIGNING_SECRET = secret = "8f742231b10e8888abcd99yyyzzz85a5"
    approval = pending()
    value = json.dumps({"approval": approval.pk, "args_hash": approval.args_hash})
    data = {"type": "block_actions", "user": {"id": f"U0{NUL}"},
            "actions": [{"action_id": "approve", "value": value, "action_ts": f"17{NUL}"}]}
    body = urllib.parse.urlencode({"payload": json.dumps(data)})
    stamp = str(int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    response = Client().post("/integrations/slack/interactions", body, content_type="application/x-www-form-urlencoded",
                             headers={"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature})
    assert response.status_code == 200
    slack.wait_idle()
    row = SlackAction.objects.get()
    assert (row.member_id, row.action_ts, row.outcome) == (f"U0{CLEAN}", f"17{CLEAN}", "refused: unlinked Slack user")
