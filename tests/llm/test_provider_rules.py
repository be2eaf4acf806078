"""What real providers accept and answer, beyond the happy path: each test here is a
run or a call that a real provider (played by the fake server with its own request
checks) would have broken before."""

from __future__ import annotations

import json

import pytest
from django.conf import settings as django_settings

from agents.engine.protocols import ModelError, ModelRequest
from agents.llm.anthropic import AnthropicClient
from agents.llm.http import HttpOptions
from agents.llm.openai import OpenAIClient
from agents.models import AgentProfile, ToolCall
from agents.tools import built_in
from tests.llm.provider import ANTHROPIC_KEY, OPENAI_KEY, Reply
from tests.llm.shapes import (
    anthropic_check,
    anthropic_error,
    anthropic_message,
    llama_cpp_context_error,
    ollama_check,
    openai_completion,
    openai_error,
)

TOOLS = built_in()

TASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How long is shipping to Canada?"}]


def request() -> ModelRequest:
    return ModelRequest(run_id="1", turn=0, messages=TASK, tools=TOOLS[:2])


def gpt(provider, sleeps, **kw) -> OpenAIClient:
    return OpenAIClient(model="llama3.2", api_key=OPENAI_KEY, base_url=f"{provider.url}/v1",
                        options=HttpOptions(timeout=5.0, retries=kw.get("retries", 3), backoff=0.5, sleep=sleeps))


def claude(provider, sleeps, **kw) -> AnthropicClient:
    return AnthropicClient(model="claude-sonnet-4-20250514", api_key=ANTHROPIC_KEY, base_url=provider.url,
                           options=HttpOptions(timeout=5.0, retries=kw.get("retries", 3), backoff=0.5, sleep=sleeps))


@pytest.fixture
def ollama(defaults, openai_env) -> AgentProfile:
    openai_env.check = ollama_check
    return AgentProfile.objects.create(name="local", provider="openai", model_name="llama3.2", tools=["kb_search"])


@pytest.fixture
def sonnet(defaults, anthropic_env) -> AgentProfile:
    return AgentProfile.objects.create(name="sonnet", provider="anthropic", model_name="claude-sonnet-4-20250514",
                                       tools=["kb_search"])


# -- 1. invalid tool-call arguments ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_invalid_arguments_are_replayed_as_an_object_and_the_raw_text_reaches_the_model(
    ollama, provider, launch, drive
) -> None:
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_0", "kb_search", '{"query": "ship')])),
        Reply(body=openai_completion(content="Shipping takes 6-9 business days.")),
    )
    run = drive(launch(None, agent="local", task="How long is shipping?"))
    assert run.state == "done", run.error
    replayed = provider.requests[1].json["messages"]
    assert replayed[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    result = json.loads(replayed[2]["content"])
    assert result["error"] == "invalid_arguments" and '{"query": "ship' in result["detail"]
    # The stored transcript keeps what the model really sent.
    assert run.messages.filter(role="assistant").first().tool_calls[0]["args"] == '{"query": "ship'


# -- 2. whitespace-only text next to tool_use ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_whitespace_only_text_is_not_replayed_to_anthropic(sonnet, provider, launch, drive) -> None:
    provider.add(
        Reply(body=anthropic_message(text="\n\n", tool_uses=[("toolu_1", "kb_search", {"query": "shipping"})])),
        Reply(body=anthropic_message(text="6-9 business days.")),
    )
    run = drive(launch(None, agent="sonnet", task="How long is shipping?"))
    assert run.state == "done", run.error
    assistant = provider.requests[1].json["messages"][1]
    assert [b["type"] for b in assistant["content"]] == ["tool_use"]


# -- 3. stop reasons that are not a final answer --------------------------------------


def test_context_window_exceeded_stop_is_a_cut_off_reply_not_an_answer(provider, sleeps) -> None:
    provider.add(Reply(body=anthropic_message(text="Shipping to Canada takes", stop_reason="model_context_window_exceeded")))
    with pytest.raises(ModelError, match="context window"):
        claude(provider, sleeps).propose(request())


def test_pause_turn_is_continued_not_taken_as_the_answer(provider, sleeps) -> None:
    provider.check = anthropic_check
    paused = anthropic_message(text="Let me keep looking.", stop_reason="pause_turn", usage=(400, 20))
    provider.add(Reply(body=paused), Reply(body=anthropic_message(text="6-9 business days.", usage=(450, 10))))
    decision = claude(provider, sleeps).propose(request())
    assert decision.final == "6-9 business days."
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (850, 30)
    # The paused turn goes back as the assistant's last turn, as the API asks.
    again = provider.requests[1].json["messages"]
    assert again[-1] == {"role": "assistant", "content": paused["content"]}


def test_a_turn_that_stays_paused_is_a_model_error(provider, sleeps) -> None:
    provider.add(*[Reply(body=anthropic_message(text="Still looking.", stop_reason="pause_turn"))] * 5)
    with pytest.raises(ModelError, match="pause_turn"):
        claude(provider, sleeps).propose(request())
    assert len(provider.requests) == 4


# -- 4. duplicate tool-call ids in one reply -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_duplicate_call_ids_in_one_reply_run_both_calls(ollama, provider, launch, drive) -> None:
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_0", "kb_search", {"query": "shipping"}),
                                                 ("call_0", "kb_search", {"query": "refund"})])),
        Reply(body=openai_completion(content="Both answered.")),
    )
    run = drive(launch(None, agent="local", task="Shipping and refunds?"))
    assert run.state == "done", run.error
    ran = ToolCall.objects.filter(run=run).order_by("step")
    assert [c.args["query"] for c in ran] == ["shipping", "refund"]
    assert len({c.call_id for c in ran}) == 2
    replayed = provider.requests[1].json["messages"]
    ids = [c["id"] for c in replayed[1]["tool_calls"]]
    assert len(set(ids)) == 2 and [m["tool_call_id"] for m in replayed[2:]] == ids
    assert "kb-shipping" in replayed[2]["content"] and "kb-refunds" in replayed[3]["content"]
    renamed = run.transitions.get(kind="model", payload__decision="calls").payload["renamed_ids"]
    assert renamed == {ids[1]: "call_0"}


# -- 6. retries, timeouts and context errors -------------------------------------------


def test_retry_after_ms_is_honoured(provider, sleeps) -> None:
    provider.add(Reply(429, openai_error("Rate limit reached"), headers={"retry-after-ms": "1500", "retry-after": "2"}),
                 Reply(body=openai_completion(content="ok")))
    assert gpt(provider, sleeps).propose(request()).final == "ok"
    assert sleeps == [1.5]


def test_x_should_retry_overrides_the_status(provider, sleeps) -> None:
    provider.add(Reply(500, openai_error("do not repeat", type_="server_error"), headers={"x-should-retry": "false"}))
    with pytest.raises(ModelError, match="HTTP 500"):
        gpt(provider, sleeps).propose(request())
    assert len(provider.requests) == 1
    provider.add(Reply(400, openai_error("try me again"), headers={"x-should-retry": "true"}),
                 Reply(body=openai_completion(content="ok")))
    assert gpt(provider, sleeps).propose(request()).final == "ok"
    assert len(provider.requests) == 3


def test_insufficient_quota_is_not_retried(provider, sleeps) -> None:
    provider.add(*[Reply(429, openai_error("You exceeded your current quota, please check your plan and billing details.",
                                           type_="insufficient_quota", code="insufficient_quota"))] * 4)
    with pytest.raises(ModelError, match="quota"):
        gpt(provider, sleeps).propose(request())
    assert len(provider.requests) == 1 and sleeps == []


def test_409_is_retried_like_the_official_sdks(provider, sleeps) -> None:
    provider.add(Reply(409, anthropic_error("invalid_request_error", "conflict")), Reply(body=anthropic_message(text="ok")))
    assert claude(provider, sleeps).propose(request()).final == "ok"
    assert len(provider.requests) == 2


def test_default_timeout_covers_a_full_non_streamed_reply() -> None:
    # At a slow 20 tokens/s, max_tokens of output must arrive before the timeout.
    assert django_settings.AIRLOCK_LLM_TIMEOUT >= django_settings.AIRLOCK_ANTHROPIC_MAX_TOKENS / 20
    assert HttpOptions().timeout >= 4096 / 20


def test_llama_cpp_context_error_is_named(provider, sleeps) -> None:
    provider.add(Reply(400, llama_cpp_context_error()))
    with pytest.raises(ModelError, match="context length exceeded"):
        gpt(provider, sleeps).propose(request())
    assert len(provider.requests) == 1


def test_anthropic_input_plus_max_tokens_error_is_named(provider, sleeps) -> None:
    provider.add(Reply(400, anthropic_error(
        "invalid_request_error",
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again")))
    with pytest.raises(ModelError, match="context length exceeded"):
        claude(provider, sleeps).propose(request())
