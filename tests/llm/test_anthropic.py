"""The Anthropic client against a fake server speaking the Messages API."""

from __future__ import annotations

import pytest

from agents.engine.protocols import ModelError, ModelRequest
from agents.llm.anthropic import AnthropicClient, wire_messages
from agents.llm.http import HttpOptions
from agents.models import AgentProfile
from agents.tools import built_in
from tests.llm.provider import Reply
from tests.llm.shapes import anthropic_error, anthropic_message

TOOLS = built_in()

KEY = "sk-ant-api03-test-0123456789"
TASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Refund order 1042 please."}]


def client(provider, sleeps, **options) -> AnthropicClient:
    opts = HttpOptions(timeout=options.pop("timeout", 5.0), retries=options.pop("retries", 3),
                       backoff=0.5, max_sleep=30.0, sleep=sleeps)
    return AnthropicClient(model="claude-sonnet-4-20250514", api_key=KEY, base_url=provider.url, options=opts)


def request(messages=None) -> ModelRequest:
    return ModelRequest(run_id="1", turn=0, messages=messages or TASK, tools=TOOLS)


def test_text_answer_is_final_and_headers_and_body_follow_the_api(provider, sleeps) -> None:
    provider.add(Reply(body=anthropic_message(text="Done.", usage=(410, 57))))
    decision = client(provider, sleeps).propose(request())
    assert decision.final == "Done."
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (410, 57)
    sent = provider.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY and sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.json["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert sent.json["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Refund order 1042 please.", "cache_control": {"type": "ephemeral"}}]}]
    assert sent.json["max_tokens"] == 4096
    refund = next(t for t in sent.json["tools"] if t["name"] == "refund")
    assert refund["input_schema"]["required"] == ["order_id", "reason"]


def test_several_tool_uses_keep_ids_and_order(provider, sleeps) -> None:
    provider.add(Reply(body=anthropic_message(text="Let me look.", tool_uses=[
        ("toolu_01A", "kb_search", {"query": "refund"}), ("toolu_01B", "refund", {"order_id": "1042", "reason": "broken"}),
    ])))
    decision = client(provider, sleeps).propose(request())
    assert decision.text == "Let me look."
    assert [(c.id, c.tool, c.args) for c in decision.calls] == [
        ("toolu_01A", "kb_search", {"query": "refund"}),
        ("toolu_01B", "refund", {"order_id": "1042", "reason": "broken"}),
    ]


def test_tool_results_of_one_turn_go_back_in_one_user_turn() -> None:
    system, turns = wire_messages([
        *TASK,
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "tool": "kb_search", "args": {"query": "x"}},
            {"id": "toolu_2", "tool": "refund", "args": "{not json"},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "kb_search", "content": "[]"},
        {"role": "tool", "tool_call_id": "toolu_2", "name": "refund",
         "content": '{"ok": false, "error": "not_permitted", "detail": "rejected"}'},
    ])
    assert system == "Be brief."
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[1]["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_1", "name": "kb_search", "input": {"query": "x"}},
        {"type": "tool_use", "id": "toolu_2", "name": "refund", "input": {"value": "{not json"}},
    ]
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "[]"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
         "content": '{"ok": false, "error": "not_permitted", "detail": "rejected"}'},
    ]


def test_overloaded_529_with_retry_after_then_success(provider, sleeps) -> None:
    provider.add(Reply(529, anthropic_error("overloaded_error", "Overloaded"), headers={"retry-after": "3"}),
                 Reply(body=anthropic_message(text="ok")))
    assert client(provider, sleeps).propose(request()).final == "ok"
    assert sleeps == [3.0]


def test_repeated_500s_are_bounded(provider, sleeps) -> None:
    provider.add(*[Reply(500, anthropic_error("api_error", "Internal server error"))] * 4)
    with pytest.raises(ModelError, match=r"gave up after 2 attempt\(s\)"):
        client(provider, sleeps, retries=1).propose(request())
    assert len(provider.requests) == 2


def test_prompt_too_long_is_a_context_length_error(provider, sleeps) -> None:
    provider.add(Reply(400, anthropic_error("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")))
    with pytest.raises(ModelError, match="context length exceeded"):
        client(provider, sleeps).propose(request())
    assert len(provider.requests) == 1


def test_malformed_and_empty_and_refusal(provider, sleeps) -> None:
    provider.add(Reply(body="not json at all"), Reply(body={"type": "message", "content": []}),
                 Reply(body=anthropic_message(text="", stop_reason="refusal")))
    c = client(provider, sleeps)
    with pytest.raises(ModelError, match="malformed response"):
        c.propose(request())
    with pytest.raises(ModelError, match="empty reply"):
        c.propose(request())
    with pytest.raises(ModelError, match="refused"):
        c.propose(request())


def test_non_object_input_is_passed_on_for_the_engine_to_reject(provider, sleeps) -> None:
    provider.add(Reply(body=anthropic_message(tool_uses=[("toolu_9", "kb_search", "shipping")])))
    assert client(provider, sleeps).propose(request()).calls[0].args == "shipping"


def test_read_timeout_is_a_model_error(provider, sleeps) -> None:
    provider.add(Reply(delay=2, body=anthropic_message(text="late")))
    with pytest.raises(ModelError, match="timed out"):
        client(provider, sleeps, timeout=0.2, retries=0).propose(request())


@pytest.mark.django_db(transaction=True)
def test_full_run_through_the_store_pauses_for_the_refund(defaults, provider, monkeypatch, settings, launch, drive) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", provider.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    AgentProfile.objects.create(name="claude", provider="anthropic", model_name="claude-sonnet-4-20250514",
                                tools=["kb_search", "refund"], price_input_micros=3_000_000, price_output_micros=15_000_000)
    provider.add(
        Reply(body=anthropic_message(tool_uses=[("toolu_kb", "kb_search", {"query": "refund policy"})], usage=(1000, 40))),
        Reply(body=anthropic_message(text="Refunding.", tool_uses=[
            ("toolu_rf", "refund", {"order_id": "1042", "reason": "arrived broken"})], usage=(1500, 60))),
    )
    run = drive(launch(None, agent="claude", task="Refund order 1042, it arrived broken."))
    assert run.state == "awaiting_approval"
    assert run.approvals.get().tool == "refund" and run.approvals.get().call_id == "toolu_rf"
    assert run.tokens == 1000 + 40 + 1500 + 60
    assert run.cost_micros == (3000 + 600) + (4500 + 900)
    second = provider.requests[1].json["messages"]
    assert second[-1]["content"][0]["tool_use_id"] == "toolu_kb"
