"""A misbehaving model provider, end to end: the fake server (tests/llm) speaks the
OpenAI wire format, the run goes through the store, and the timeline page shows what
happened. The client-level cases live in tests/llm; here every fault must end as a
clear row (a transition or the run's error), after a bounded number of requests, on a
page that renders."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape

from agents.models import AgentProfile
from tests.llm.provider import Reply
from tests.llm.shapes import openai_completion, openai_error

pytestmark = pytest.mark.django_db(transaction=True)

RETRIES = 2  # so a failing provider is asked exactly RETRIES + 1 times
OK = Reply(body=openai_completion(content="recovered"))


def calls(*tool_calls) -> Reply:
    return Reply(body=openai_completion(tool_calls=list(tool_calls)))


# name -> (replies, final state, text the run records and the page shows, requests made)
CASES = {
    "invalid JSON arguments": ([calls(("c1", "echo", '{"text": "hi')), OK], "done", "invalid_arguments", 2),
    "an array instead of an object": (
        [calls(("c1", "echo", '["hi"]')), OK], "done", "arguments must be a JSON object, not list", 2,
    ),
    "an unknown tool": (
        [calls(("c1", "format_disk", {"all": True})), OK], "done", "no tool named 'format_disk'", 2,
    ),
    "a schema violation": ([calls(("c1", "echo", {"text": 5})), OK], "done", "5 is not of type 'string'", 2),
    "a body that is not JSON": ([Reply(body="<html>502 Bad Gateway</html>")], "failed", "malformed response", 1),
    "empty choices": ([Reply(body={**openai_completion(content="x"), "choices": []})], "failed", "empty response", 1),
    "429 with Retry-After, then an answer": (
        [Reply(429, openai_error("Rate limit reached", code="rate_limit_exceeded"), headers={"Retry-After": "1"}), OK],
        "done", "recovered", 2,
    ),
    "429 with Retry-After every time": (
        [Reply(429, openai_error("Rate limit reached", code="rate_limit_exceeded"), headers={"Retry-After": "1"})] * 3,
        "failed", "gave up after 3 attempt(s): HTTP 429", 3,
    ),
    "repeated 500s": (
        [Reply(500, openai_error("The server had an error", type_="server_error"))] * 3,
        "failed", "gave up after 3 attempt(s): HTTP 500", 3,
    ),
    "a read timeout": ([Reply(delay=1.5, body=openai_completion(content="late"))] * 3, "failed", "timed out", 3),
}


@pytest.fixture
def gpt(defaults, provider, monkeypatch, settings) -> AgentProfile:  # noqa: F811
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-reliability-0123456789")
    settings.AIRLOCK_LLM_RETRIES = RETRIES
    settings.AIRLOCK_LLM_BACKOFF = 0.0
    settings.AIRLOCK_LLM_MAX_SLEEP = 0.05  # Retry-After is honoured, capped, in tests
    settings.AIRLOCK_LLM_TIMEOUT = 0.3
    return AgentProfile.objects.create(
        name="gpt", provider="openai", model_name="gpt-4o-mini", tools=["echo", "ledger_write"],
        price_input_micros=150_000, price_output_micros=600_000,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_model_fault_is_recorded_bounded_and_shown(gpt, provider, launch, drive, case: str) -> None:  # noqa: F811
    replies, state, text, requests = CASES[case]
    provider.add(*replies)
    run = drive(launch(None, agent="gpt", task=f"provoke {case}"))
    assert run.state == state, run.error
    assert len(provider.requests) == requests  # retries are bounded
    if state == "failed":
        assert run.error.startswith("model error: openai: ") and text in run.error
        assert run.transitions.order_by("-seq").first().to_state == "failed"
    elif text != "recovered":
        recorded = run.transitions.exclude(payload__invalid=None).get()
        assert text in str(recorded.payload["invalid"])
        assert run.answer == "recovered"
    assert "sk-test-reliability" not in (run.error or "")

    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert escape(text) in html or text in html
    assert "Traceback" not in html and "sk-test-reliability" not in html
