"""API keys never reach rows, exports or logs, even when a provider echoes them back."""

from __future__ import annotations

import json
import logging
import secrets

import pytest

from agents.models import AgentProfile, Approval, Message, Run, ToolCall, Transition
from agents.runs.export import export_run
from tests.llm.provider import Reply
from tests.llm.shapes import openai_error

pytestmark = pytest.mark.django_db(transaction=True)


def everything_stored() -> str:
    rows = [
        *Run.objects.values(), *Transition.objects.values(), *Message.objects.values(),
        *ToolCall.objects.values(), *Approval.objects.values(),
    ]
    exports = [export_run(run) for run in Run.objects.all()]
    return json.dumps([rows, exports], default=str)


def test_canary_key_appears_in_no_row_export_or_log(defaults, provider, monkeypatch, settings, launch, drive, caplog) -> None:
    canary = f"sk-canary-{secrets.token_hex(12)}"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    settings.AIRLOCK_LLM_BACKOFF = 0.0
    settings.AIRLOCK_LLM_RETRIES = 1
    settings.AIRLOCK_LLM_TIMEOUT = 0.3
    AgentProfile.objects.create(name="gpt", provider="openai", model_name="gpt-4o-mini", tools=["kb_search"])
    caplog.set_level(logging.DEBUG)
    echoed = f"Incorrect API key provided: {canary}. You can find your API key at https://platform.openai.com."
    provider.add(
        # 1: a 401 whose message repeats the key (OpenAI masks it; a proxy might not)
        Reply(401, openai_error(echoed, code="invalid_api_key")),
        # 2: 5xx errors that echo it, retried out
        Reply(502, f"upstream said: bad key {canary}"), Reply(503, {"error": {"message": echoed}}),
        # 3: a malformed 200 that contains it
        Reply(200, f"<html>{canary}</html>"),
        # 4: a timeout, then a compatible server's 200 error object with the key
        Reply(delay=1.5, body={}), Reply(200, {"error": {"message": echoed}}),
    )
    runs = [drive(launch(None, agent="gpt", task=f"question {i}")) for i in range(4)]
    assert [r.state for r in runs] == ["failed"] * 4
    assert "authentication failed" in runs[0].error
    assert "gave up after 2 attempt(s)" in runs[1].error
    assert "malformed response" in runs[2].error
    assert "error response" in runs[3].error
    # The key really went out (in the Authorization header), so the test means something.
    assert provider.requests[0].headers["authorization"] == f"Bearer {canary}"
    assert canary not in everything_stored()
    assert "[redacted]" in runs[0].error
    assert canary not in caplog.text
    assert "committed run=" in caplog.text  # the logs were captured
