"""Hostile JSON from a model provider (issue 34, item 7): a reply holding 1e400 or NaN
is a clear ModelError, and arguments that do not parse safely reach the engine as text
(recorded as invalid arguments), so no row is ever asked to store infinity."""

from __future__ import annotations

import json

import pytest

from agents.engine.protocols import ModelError, ModelRequest
from agents.llm.anthropic import AnthropicClient
from agents.llm.http import HttpOptions
from agents.llm.openai import OpenAIClient
from agents.tools import built_in
from tests.llm.provider import Reply
from tests.llm.shapes import anthropic_message, openai_completion

KEY = "sk-test-0123456789abcdef"
REQUEST = ModelRequest(run_id="1", turn=0, messages=[{"role": "user", "content": "hi"}], tools=built_in()[:2])


def options(sleeps) -> HttpOptions:
    return HttpOptions(timeout=5.0, retries=0, backoff=0.5, max_sleep=30.0, sleep=sleeps)


@pytest.mark.parametrize("number", ["1e400", "NaN", "-Infinity"])
def test_a_reply_with_a_non_finite_number_is_a_model_error(provider, sleeps, number) -> None:
    body = json.dumps(anthropic_message(tool_uses=[("toolu_1", "kb_search", {"query": "x", "n": 12345})]))
    provider.add(Reply(body=body.replace("12345", number)))
    client = AnthropicClient(model="claude-sonnet-4-20250514", api_key=KEY, base_url=provider.url, options=options(sleeps))
    with pytest.raises(ModelError, match=f"malformed response \\({number} at .*n is not a finite number"):
        client.propose(REQUEST)


@pytest.mark.parametrize("arguments", ['{"query": NaN}', '{"query": 1e400}', '{"\\ud800": "x"}', "[" * 100 + "]" * 100])
def test_openai_arguments_that_do_not_parse_safely_are_passed_on_as_text(provider, sleeps, arguments) -> None:
    provider.add(Reply(body=openai_completion(tool_calls=[("call_x", "kb_search", arguments)])))
    client = OpenAIClient(model="gpt-4o-mini", api_key=KEY, base_url=f"{provider.url}/v1", options=options(sleeps))
    assert client.propose(REQUEST).calls[0].args == arguments
