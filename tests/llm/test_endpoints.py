"""Per-profile endpoints: each profile may name its own base URL and the environment
variable holding its key, so OpenAI, a local vLLM and Anthropic work side by side."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agents.models import AgentProfile, Message, Run, Transition
from tests.llm.provider import Reply
from tests.llm.shapes import anthropic_message, openai_completion

OPENAI_KEY = "sk-test-0123456789abcdef"
VLLM_KEY = "sk-vllm-local-9876543210"


@pytest.mark.django_db(transaction=True)
def test_two_openai_profiles_reach_their_own_servers_with_their_own_keys(
    defaults, provider, second_provider, monkeypatch, launch, drive
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("VLLM_API_KEY", VLLM_KEY)
    AgentProfile.objects.create(name="gpt", provider="openai", model_name="gpt-4.1", tools=["kb_search"])
    AgentProfile.objects.create(name="local", provider="openai", model_name="Qwen/Qwen3-8B", tools=["kb_search"],
                                base_url=f"{second_provider.url}/v1", api_key_env="VLLM_API_KEY")
    provider.add(Reply(body=openai_completion(content="from OpenAI")))
    second_provider.add(Reply(body=openai_completion(content="from vLLM")))
    assert drive(launch(None, agent="local", task="hi")).answer == "from vLLM"
    assert drive(launch(None, agent="gpt", task="hi")).answer == "from OpenAI"
    (to_vllm,), (to_openai,) = second_provider.requests, provider.requests
    assert to_vllm.headers["authorization"] == f"Bearer {VLLM_KEY}" and to_vllm.json["model"] == "Qwen/Qwen3-8B"
    assert to_openai.headers["authorization"] == f"Bearer {OPENAI_KEY}" and to_openai.json["model"] == "gpt-4.1"
    # Only the variable's name is stored, never the key.
    for model in (AgentProfile, Run, Transition, Message):
        assert VLLM_KEY not in repr(list(model.objects.values()))


@pytest.mark.django_db(transaction=True)
def test_a_profile_whose_key_variable_is_unset_fails_naming_the_variable(
    defaults, second_provider, monkeypatch, launch, drive
) -> None:
    monkeypatch.delenv("TEAM_CLAUDE_API_KEY", raising=False)
    AgentProfile.objects.create(name="claude", provider="anthropic", model_name="claude-sonnet-4-20250514",
                                base_url=second_provider.url, api_key_env="TEAM_CLAUDE_API_KEY")
    run = drive(launch(None, agent="claude", task="hi"))
    assert run.state == "failed" and run.error == "model error: anthropic: TEAM_CLAUDE_API_KEY is not set"
    assert second_provider.requests == []
    monkeypatch.setenv("TEAM_CLAUDE_API_KEY", "sk-ant-team-0123456789")
    second_provider.add(Reply(body=anthropic_message(text="hello")))
    assert drive(launch(None, agent="claude", task="hi")).answer == "hello"
    assert second_provider.requests[0].headers["x-api-key"] == "sk-ant-team-0123456789"


@pytest.mark.django_db
def test_the_key_field_takes_a_key_variable_name_not_a_key(defaults) -> None:
    for wrong in ("sk-live-abc123", "SECRET_KEY", "DATABASE_URL"):
        profile = AgentProfile(name="x", provider="openai", model_name="m", api_key_env=wrong)
        with pytest.raises(ValidationError, match="ending in _API_KEY"):
            profile.full_clean()


@pytest.mark.django_db(transaction=True)
def test_a_profile_cannot_send_another_secret_as_its_key(defaults, second_provider, launch, drive) -> None:
    # Saved without validation (a shell, a fixture): the client still refuses the name.
    AgentProfile.objects.create(name="leaky", provider="openai", model_name="m",
                                base_url=f"{second_provider.url}/v1", api_key_env="SECRET_KEY")
    run = drive(launch(None, agent="leaky", task="hi"))
    assert run.state == "failed"
    assert run.error == "model error: api_key_env 'SECRET_KEY' must name an environment variable ending in _API_KEY"
    assert second_provider.requests == []
