"""The OpenAI (compatible) client against a fake server speaking Chat Completions."""

from __future__ import annotations

import json

import pytest

from agents.engine.protocols import ModelError, ModelRequest
from agents.llm.http import HttpOptions
from agents.llm.openai import OpenAIClient, wire_messages
from agents.models import AgentProfile, ToolCall
from agents.tools import built_in
from tests.llm.provider import Reply
from tests.llm.shapes import openai_completion, openai_error

TOOLS = built_in()

KEY = "sk-test-0123456789abcdef"
TASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How long is shipping to Canada?"}]


def client(provider, sleeps, **options) -> OpenAIClient:
    opts = HttpOptions(timeout=options.pop("timeout", 5.0), retries=options.pop("retries", 3),
                       backoff=options.pop("backoff", 0.5), max_sleep=options.pop("max_sleep", 30.0), sleep=sleeps)
    return OpenAIClient(model="gpt-4o-mini", api_key=KEY, base_url=f"{provider.url}/v1", options=opts)


def request(messages=None, turn: int = 0) -> ModelRequest:
    return ModelRequest(run_id="1", turn=turn, messages=messages or TASK, tools=TOOLS[:2])


def test_text_answer_is_a_final_decision_with_usage(provider, sleeps) -> None:
    provider.add(Reply(body=openai_completion(content="6-9 business days.", usage=(120, 9))))
    decision = client(provider, sleeps).propose(request())
    assert decision.final == "6-9 business days." and not decision.calls
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (120, 9)
    sent = provider.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.json["model"] == "gpt-4o-mini"
    assert sent.json["messages"] == [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "How long is shipping to Canada?"}]
    assert [t["function"]["name"] for t in sent.json["tools"]] == ["kb_search", "http_get"]
    assert sent.json["tools"][0]["type"] == "function"
    assert sent.json["tools"][0]["function"]["parameters"]["required"] == ["query"]


def test_several_calls_in_one_reply_keep_ids_and_order(provider, sleeps) -> None:
    provider.add(Reply(body=openai_completion(content="Checking two things.", tool_calls=[
        ("call_abc", "kb_search", {"query": "shipping"}),
        ("call_def", "http_get", {"url": "https://demo.airlock.internal/shipping"}),
    ])))
    decision = client(provider, sleeps).propose(request())
    assert decision.final is None and decision.text == "Checking two things."
    assert [(c.id, c.tool, c.args) for c in decision.calls] == [
        ("call_abc", "kb_search", {"query": "shipping"}),
        ("call_def", "http_get", {"url": "https://demo.airlock.internal/shipping"}),
    ]


def test_transcript_goes_out_in_wire_format_with_ids_and_object_arguments() -> None:
    messages = [
        *TASK,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "tool": "kb_search", "args": {"query": "x"}},
            {"id": "call_2", "tool": "kb_search", "args": "{not json"},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "kb_search", "content": "[]"},
        {"role": "tool", "tool_call_id": "call_2", "name": "kb_search", "content": '{"ok": false}'},
    ]
    wire = wire_messages(messages)
    assert wire[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "x"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "kb_search", "arguments": "{}"}},
    ]}
    assert wire[3] == {"role": "tool", "tool_call_id": "call_1", "content": "[]"}
    assert wire[4]["tool_call_id"] == "call_2"


def test_429_with_retry_after_is_retried_after_the_asked_delay(provider, sleeps) -> None:
    provider.add(
        Reply(429, openai_error("Rate limit reached for gpt-4o-mini", type_="requests", code="rate_limit_exceeded"),
              headers={"Retry-After": "2"}),
        Reply(body=openai_completion(content="ok")),
    )
    decision = client(provider, sleeps).propose(request())
    assert decision.final == "ok"
    assert sleeps == [2.0] and len(provider.requests) == 2


def test_retry_after_is_capped(provider, sleeps) -> None:
    provider.add(Reply(429, openai_error("slow down"), headers={"Retry-After": "3600"}),
                 Reply(body=openai_completion(content="ok")))
    client(provider, sleeps, max_sleep=4.0).propose(request())
    assert sleeps == [4.0]


def test_repeated_500s_give_up_after_bounded_retries(provider, sleeps) -> None:
    provider.add(*[Reply(500, openai_error("The server had an error", type_="server_error"))] * 5)
    with pytest.raises(ModelError, match=r"gave up after 3 attempt\(s\): HTTP 500"):
        client(provider, sleeps, retries=2, backoff=0.5).propose(request())
    assert len(provider.requests) == 3
    assert sleeps == [0.5, 1.0]  # exponential back-off between the tries


def test_malformed_body_is_a_clear_model_error(provider, sleeps) -> None:
    provider.add(Reply(body="<html>502 Bad Gateway</html>"))
    with pytest.raises(ModelError, match="malformed response"):
        client(provider, sleeps).propose(request())


def test_body_without_choices_is_malformed(provider, sleeps) -> None:
    provider.add(Reply(body={"id": "x", "object": "chat.completion"}))
    with pytest.raises(ModelError, match="malformed response"):
        client(provider, sleeps).propose(request())


def test_empty_choices_is_a_model_error(provider, sleeps) -> None:
    provider.add(Reply(body={**openai_completion(content="x"), "choices": []}))
    with pytest.raises(ModelError, match="empty response"):
        client(provider, sleeps).propose(request())


def test_invalid_json_arguments_are_passed_through_as_text(provider, sleeps) -> None:
    provider.add(Reply(body=openai_completion(tool_calls=[("call_x", "kb_search", '{"query": "ship')])))
    decision = client(provider, sleeps).propose(request())
    assert decision.calls[0].args == '{"query": "ship'


def test_read_timeout_is_retried_then_reported(provider, sleeps) -> None:
    provider.add(Reply(delay=2, body=openai_completion(content="late")), Reply(delay=2, body=openai_completion(content="late")))
    with pytest.raises(ModelError, match="timed out"):
        client(provider, sleeps, timeout=0.2, retries=1).propose(request())
    assert len(provider.requests) == 2 and len(sleeps) == 1


def test_refusal_is_a_model_error(provider, sleeps) -> None:
    provider.add(Reply(body=openai_completion(refusal="I can't help with that.")))
    with pytest.raises(ModelError, match="refused: I can't help with that"):
        client(provider, sleeps).propose(request())


def test_context_length_error_is_named_and_not_retried(provider, sleeps) -> None:
    provider.add(Reply(400, openai_error(
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens.",
        code="context_length_exceeded", param="messages")))
    with pytest.raises(ModelError, match="context length exceeded"):
        client(provider, sleeps).propose(request())
    assert len(provider.requests) == 1 and sleeps == []


def test_reply_cut_off_at_the_token_limit_is_a_model_error(provider, sleeps) -> None:
    provider.add(Reply(body=openai_completion(content="Shipping takes", finish_reason="length")))
    with pytest.raises(ModelError, match="cut off"):
        client(provider, sleeps).propose(request())


# -- a whole run through the store --------------------------------------------------


@pytest.fixture
def gpt_profile(defaults, provider, monkeypatch, settings) -> AgentProfile:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    settings.AIRLOCK_LLM_BACKOFF = 0.0
    return AgentProfile.objects.create(
        name="gpt", provider="openai", model_name="gpt-4o-mini", tools=["kb_search"],
        price_input_micros=150_000, price_output_micros=600_000, system_prompt="Be brief.",
    )


@pytest.mark.django_db(transaction=True)
def test_full_run_through_the_store(gpt_profile, provider, launch, drive) -> None:
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_kb", "kb_search", {"query": "shipping Canada"}),
                                                 ("call_bad", "kb_search", "{oops")], usage=(312, 24))),
        Reply(body=openai_completion(content="Shipping to Canada takes 6-9 business days.", usage=(480, 12))),
    )
    run = drive(launch(None, agent="gpt", task="How long is shipping to Canada?"))
    assert run.state == "done" and run.answer == "Shipping to Canada takes 6-9 business days."
    assert run.tokens == 312 + 24 + 480 + 12
    # ceil((312 * 0.15 + 24 * 0.6)) + ceil(480 * 0.15 + 12 * 0.6) micro-dollars
    assert run.cost_micros == 62 + 80 and not run.cost_unknown
    assert ToolCall.objects.get(run=run).call_id == "call_kb"
    invalid = run.transitions.get(payload__invalid__error="invalid_arguments")
    assert invalid.payload["call"] == {"id": "call_bad", "tool": "kb_search"}
    second = provider.requests[1].json["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in second[2]["tool_calls"]] == ["call_kb", "call_bad"]
    assert second[2]["tool_calls"][1]["function"]["arguments"] == "{}"
    assert [m["tool_call_id"] for m in second[3:]] == ["call_kb", "call_bad"]
    assert "kb-shipping" in second[3]["content"]
    assert "invalid_arguments" in second[4]["content"] and "{oops" in second[4]["content"]


@pytest.mark.django_db(transaction=True)
def test_model_error_fails_the_run_with_the_reason(gpt_profile, provider, launch, drive) -> None:
    provider.add(Reply(body={**openai_completion(content="x"), "choices": []}))
    run = drive(launch(None, agent="gpt", task="hello"))
    assert run.state == "failed" and run.error == "model error: openai: empty response (no choices)"


def test_bad_base_url_or_key_is_a_model_error_not_a_crash(provider, sleeps) -> None:
    opts = HttpOptions(retries=3, sleep=sleeps)
    with pytest.raises(ModelError, match="cannot send the request"):
        OpenAIClient(model="m", api_key=KEY, base_url="localhost:8000/v1", options=opts).propose(request())
    with pytest.raises(ModelError, match="cannot send the request") as caught:
        OpenAIClient(model="m", api_key="sk-bad\nkey-0123456789", base_url=f"{provider.url}/v1", options=opts).propose(request())
    assert "0123456789" not in str(caught.value)
    assert sleeps == []


def test_scrub_masks_escaped_spellings_of_the_key() -> None:
    from agents.llm.http import scrub

    secret = 'k"ey\nwith-escapes'
    assert scrub(f"raw {secret} repr {secret!r} json {json.dumps(secret)}", [secret]).count("[redacted]") == 3
