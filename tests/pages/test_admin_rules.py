"""An operator writes "refunds over 100 need a human" in the admin, without code."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agents.models import AgentProfile
from tests.helpers import person

pytestmark = pytest.mark.django_db

OVER_100 = {"tool": "refund", "when": {"arg": "amount", "op": "gt", "value": 100}, "then": "ask",
            "reason": "refunds over 100 need a human"}


def form(profile: AgentProfile, rules: Any) -> dict[str, Any]:
    """The change form as the browser posts it (JSON fields as text)."""
    return {
        "name": profile.name, "description": profile.description, "provider": profile.provider,
        "model_name": profile.model_name, "system_prompt": profile.system_prompt,
        "tools": json.dumps(profile.tools), "denied_tools": "[]", "always_ask_tools": "[]",
        "rules": rules if isinstance(rules, str) else json.dumps(rules),
        "irreversible_approvals": "1", "separate_duties": "on", "approval_timeout_seconds": "",
        "on_expiry": "reject", "limits": "{}", "price_input_micros": "0", "price_output_micros": "0",
        "price_cached_input_micros": "", "price_cache_write_micros": "", "base_url": "", "api_key_env": "",
        "context_tokens": "", "client_tools": "[]", "project": str(profile.project_id),
    }


@pytest.fixture
def admin_client(defaults: None) -> Client:
    client = Client()
    client.force_login(person("root", superuser=True))
    return client


def test_an_operator_adds_an_argument_rule_in_the_admin(admin_client: Client) -> None:
    demo = AgentProfile.objects.get(name="demo")
    url = f"/admin/agents/agentprofile/{demo.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "Policy" in page and "docs/policy.md" in page
    # Every field of the model is on the form (a fieldset that forgot one would hide it).
    fields = {f.name for f in AgentProfile._meta.get_fields() if f.concrete and not f.auto_created}
    assert all(f'name="{name}"' in page for name in fields), sorted(n for n in fields if f'name="{n}"' not in page)
    response = admin_client.post(url, form(demo, [OVER_100]))
    assert response.status_code == 302
    assert AgentProfile.objects.get(pk=demo.pk).rules == [OVER_100]


@pytest.mark.parametrize(
    "rules, message",
    [
        ([{**OVER_100, "then": "maybe"}], "rules[1].then: must be allow, ask or deny, not &#x27;maybe&#x27;"),
        ([{**OVER_100, "when": {"arg": "amount", "op": "over", "value": 100}}], "rules[1].when.op: must be one of"),
        ({"tool": "refund"}, "rules: must be a list of rules"),
    ],
)
def test_a_bad_rule_is_refused_with_a_readable_error(admin_client: Client, rules: Any, message: str) -> None:
    demo = AgentProfile.objects.get(name="demo")
    before = demo.rules
    response = admin_client.post(f"/admin/agents/agentprofile/{demo.pk}/change/", form(demo, rules))
    assert response.status_code == 200 and message in response.content.decode()
    assert AgentProfile.objects.get(pk=demo.pk).rules == before


def test_a_bad_client_tool_is_refused_with_a_readable_error(admin_client: Client) -> None:
    profile = AgentProfile.objects.create(name="ext", provider="external")
    data = {**form(profile, []), "client_tools": json.dumps([{"name": "crm_update", "description": "x",
            "schema": {"type": "object"}, "risk": "dangerous", "returns": "internal", "retry_safety": "safe"}])}
    response = admin_client.post(f"/admin/agents/agentprofile/{profile.pk}/change/", data)
    assert response.status_code == 200
    assert "client_tools[0].risk must be one of read, write, irreversible" in response.content.decode()
    assert AgentProfile.objects.get(pk=profile.pk).client_tools == []


def test_a_rule_for_a_tool_the_profile_does_not_offer_is_refused(admin_client: Client) -> None:
    demo = AgentProfile.objects.get(name="demo")
    before = demo.rules
    typo = {**OVER_100, "tool": "refunds"}
    response = admin_client.post(f"/admin/agents/agentprofile/{demo.pk}/change/", form(demo, [OVER_100, typo]))
    page = response.content.decode()
    assert response.status_code == 200
    assert "rules[2].tool: the agent has no tool named &#x27;refunds&#x27; (its tools: export_customers, http_get, kb_search, refund, send_email)" in page
    assert AgentProfile.objects.get(pk=demo.pk).rules == before
