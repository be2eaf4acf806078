"""Prompt caching and cache-aware cost, against the fake servers in the real wire format."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import pytest

from agents.models import AgentProfile
from tests.helpers import person
from tests.llm.provider import Reply
from tests.llm.shapes import AnthropicPromptCache, anthropic_message, openai_completion

# Long enough that caching it matters (and that a real model would cache it).
HANDBOOK = "You are the help desk of a shop. " + " ".join(f"Rule {i}: answer from the knowledge base." for i in range(300))


@pytest.fixture
def gpt(defaults, openai_env):
    def make(**prices) -> AgentProfile:
        return AgentProfile.objects.create(name="gpt", provider="openai", model_name="gpt-4.1", tools=["kb_search"],
                                           price_input_micros=2_000_000, price_output_micros=8_000_000, **prices)
    return make


@pytest.mark.django_db(transaction=True)
def test_openai_cached_input_is_priced_at_the_cached_price(gpt, provider, launch, drive) -> None:
    gpt(price_cached_input_micros=500_000)
    provider.add(Reply(body=openai_completion(content="6-9 days.", usage=(2000, 100), cached=1536)))
    run = drive(launch(None, agent="gpt", task="Shipping?"))
    # 464 fresh input tokens at $2/M, 1536 cached at $0.50/M, 100 output at $8/M.
    assert run.cost_micros == math.ceil(464 * 2 + 1536 * 0.5 + 100 * 8) == 2496
    usage = run.transitions.get(kind="model").payload["usage"]
    assert usage == {"input_tokens": 2000, "output_tokens": 100, "cached_input_tokens": 1536}


@pytest.mark.django_db(transaction=True)
def test_empty_cache_prices_mean_the_input_price(gpt, provider, launch, drive) -> None:
    gpt()
    provider.add(Reply(body=openai_completion(content="6-9 days.", usage=(2000, 100), cached=1536)))
    run = drive(launch(None, agent="gpt", task="Shipping?"))
    assert run.cost_micros == 2000 * 2 + 100 * 8


@pytest.mark.django_db(transaction=True)
def test_openai_prompt_prefix_is_byte_identical_across_steps(gpt, provider, launch, drive) -> None:
    gpt()
    AgentProfile.objects.filter(name="gpt").update(system_prompt=HANDBOOK)
    provider.add(
        Reply(body=openai_completion(tool_calls=[("call_1", "kb_search", {"query": "shipping"})])),
        Reply(body=openai_completion(tool_calls=[("call_2", "kb_search", {"query": "refund"})])),
        Reply(body=openai_completion(content="Done.")),
    )
    run = drive(launch(None, agent="gpt", task="Shipping and refunds?"))
    assert run.state == "done", run.error
    sent = [r.json for r in provider.requests]
    assert len(sent) == 3
    for earlier, later in pairwise(sent):
        assert json.dumps(later["tools"]) == json.dumps(earlier["tools"])
        prefix = json.dumps(earlier["messages"])[:-1]  # without the closing bracket
        assert json.dumps(later["messages"]).startswith(prefix)
    assert sent[0]["messages"][0] == {"role": "system", "content": HANDBOOK}


# -- Anthropic: breakpoints and what they save ------------------------------------------


@pytest.fixture
def sonnet(defaults, anthropic_env) -> AgentProfile:
    anthropic_env.usage_for = AnthropicPromptCache()
    return AgentProfile.objects.create(
        name="sonnet", provider="anthropic", model_name="claude-sonnet-4-20250514", tools=["kb_search"],
        system_prompt=HANDBOOK, price_input_micros=3_000_000, price_output_micros=15_000_000,
        price_cached_input_micros=300_000, price_cache_write_micros=3_750_000,
    )


def marked(body) -> list[str]:
    """Where the request's cache_control breakpoints are, as readable names."""
    where = [f"tool:{t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    where += ["system" for b in body.get("system", []) if "cache_control" in b]
    for i, turn in enumerate(body["messages"]):
        for j, block in enumerate(turn["content"]):
            if "cache_control" in block:
                where.append(f"{i}.{j}:{block['type']}")
    return where


@pytest.mark.django_db(transaction=True)
def test_anthropic_breakpoints_let_each_step_read_the_previous_one(sonnet, provider, launch, drive, client) -> None:
    provider.add(
        Reply(body=anthropic_message(tool_uses=[("toolu_1", "kb_search", {"query": "shipping"})], usage=(1, 30))),
        Reply(body=anthropic_message(text="And refunds:", tool_uses=[("toolu_2", "kb_search", {"query": "refund"}),
                                                                     ("toolu_3", "kb_search", {"query": "hours"})],
                                     usage=(1, 40))),
        Reply(body=anthropic_message(text="Shipping 6-9 days; refunds within 30 days.", usage=(1, 20))),
    )
    run = drive(launch(None, agent="sonnet", task="Shipping and refunds?"))
    assert run.state == "done", run.error
    sent = [r.json for r in provider.requests]
    # 1: the stable prefix (tools + system) and the task; later: the newest turn and
    # the turn where the previous request put its last breakpoint.
    assert marked(sent[0]) == ["system", "0.0:text"]
    assert marked(sent[1]) == ["system", "0.0:text", "2.0:tool_result"]
    assert marked(sent[2]) == ["system", "2.0:tool_result", "4.1:tool_result"]
    usages = [t.payload["usage"] for t in run.transitions.filter(kind="model").order_by("seq")]
    assert "cached_input_tokens" not in usages[0] and usages[0]["cache_write_tokens"] > 1000
    assert all(u["cached_input_tokens"] >= usages[0]["cache_write_tokens"] for u in usages[1:])
    # Each step read everything the previous step wrote.
    for before, after in pairwise(usages):
        assert after["cached_input_tokens"] == before.get("cached_input_tokens", 0) + before["cache_write_tokens"]
    priced = sum(
        math.ceil((u["input_tokens"] - u.get("cached_input_tokens", 0) - u["cache_write_tokens"]) * 3
                  + u.get("cached_input_tokens", 0) * 0.3 + u["cache_write_tokens"] * 3.75 + u["output_tokens"] * 15)
        for u in usages
    )
    at_input_price = sum(math.ceil(u["input_tokens"] * 3 + u["output_tokens"] * 15) for u in usages)
    assert run.cost_micros == priced
    assert run.cost_micros < 0.75 * at_input_price
    # The timeline shows the cached tokens, per step and for the run.
    client.force_login(person("ops", superuser=True))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    cached_total = sum(u.get("cached_input_tokens", 0) for u in usages)
    assert f"{cached_total:,} cached" in page
    assert f"{usages[1]['cached_input_tokens']:,} cached" in page


@pytest.mark.django_db(transaction=True)
def test_a_scripted_replay_carries_cache_usage_and_prices_it_the_same(defaults, launch, drive) -> None:
    from agents.runs.export import replay_script

    AgentProfile.objects.create(name="cachey", provider="scripted", model_name="script", tools=["echo"],
                                price_input_micros=1_000_000, price_cached_input_micros=100_000,
                                price_cache_write_micros=1_250_000)
    usage = {"input_tokens": 5000, "output_tokens": 10, "cached_input_tokens": 4000, "cache_write_tokens": 800}
    run = drive(launch([{"final": "ok", "usage": usage}], agent="cachey"))
    assert run.cost_micros == 200 + 400 + 1000
    assert replay_script(run) == [{"final": "ok", "usage": usage}]
    again = drive(launch(replay_script(run), agent="cachey"))
    assert again.cost_micros == run.cost_micros


@pytest.mark.django_db
def test_a_script_cannot_claim_more_cached_tokens_than_input(defaults, launch) -> None:
    from agents.actions.base import ActionError

    with pytest.raises(ActionError, match="cannot exceed"):
        launch([{"final": "ok", "usage": {"input_tokens": 10, "output_tokens": 1, "cached_input_tokens": 11}}])
