"""A profile's limits and tool lists are checked where Django checks (the model's
clean(): the admin, the project admin, full_clean()) in the launch API's words, and a
row broken anyway costs only itself: unavailable on the launch form with the reason,
a launch of it refused naming the field, listed by `manage.py check`."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils.html import escape

from agents.actions.base import ActionError
from agents.actions.runs import run_launch
from agents.models import AgentProfile, McpServer
from tests.helpers import client_for, csrf_post, person
from tests.pages.test_admin_rules import form

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(defaults: None) -> Client:
    client = Client()
    client.force_login(person("root", superuser=True))
    return client


def launch_refusal(limits: dict[str, Any]) -> str:
    """What the launch API says of these limits asked for at launch."""
    with pytest.raises(ActionError) as refused:
        run_launch(agent="demo", task="t", limits=limits)
    assert refused.value.code == "invalid_limits"
    return str(refused.value.detail)


@pytest.mark.parametrize(
    "limits", [{"max_steps": "many"}, {"max_stepz": 5}, {"max_steps": 0}, {"max_steps": True}, {"max_tokens": 1.5}]
)
def test_the_admin_refuses_limits_with_the_launch_apis_message(admin_client: Client, limits: Any) -> None:
    demo = AgentProfile.objects.get(name="demo")
    response = admin_client.post(
        f"/admin/agents/agentprofile/{demo.pk}/change/", {**form(demo, []), "limits": json.dumps(limits)}
    )
    assert response.status_code == 200
    assert escape(launch_refusal(limits)) in response.content.decode()
    assert AgentProfile.objects.get(pk=demo.pk).limits == demo.limits  # unchanged


@pytest.mark.parametrize(
    "limits, message",
    [
        ([1], "limits must be an object like {&quot;max_steps&quot;: 10}, not list [1]"),
        ({"deadline_seconds": 10**10}, "deadline_seconds must be at most 31622400, not 10000000000"),
        ({"max_steps": 100_001}, "max_steps must be at most 100000, not 100001"),
        ("", "limits must be an object: write {} for the defaults"),  # an empty box
    ],
)
def test_the_admin_refuses_limits_of_the_wrong_shape_or_past_their_ceiling(
    admin_client: Client, limits: Any, message: str
) -> None:
    demo = AgentProfile.objects.get(name="demo")
    data = {**form(demo, []), "limits": json.dumps(limits) if limits != "" else ""}
    response = admin_client.post(f"/admin/agents/agentprofile/{demo.pk}/change/", data)
    assert response.status_code == 200 and message in response.content.decode()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("tools", '"kb_search"',
         "a list of tool names, like [&quot;kb_search&quot;, &quot;SERVER__*&quot;], not &#x27;kb_search&#x27;"),
        ("tools", '["kb_serch"]', "no tool named &#x27;kb_serch&#x27; (tools: "),
        ("tools", '["kb_search", "kb_search"]', "&#x27;kb_search&#x27; is listed twice"),
        ("denied_tools", '["refund", "nowhere__*"]', "no tool named &#x27;nowhere__*&#x27;"),
        ("always_ask_tools", '[3]', "a list of tool names"),
        ("always_ask_tools", '["crm__update"]', "no tool named &#x27;crm__update&#x27;"),
        ("denied_tools", "", "a list of tool names: write [] for none"),  # an empty box
    ],
)
def test_the_admin_refuses_tool_lists_that_name_nothing(
    admin_client: Client, field: str, value: str, message: str
) -> None:
    demo = AgentProfile.objects.get(name="demo")
    before = getattr(demo, field)
    response = admin_client.post(f"/admin/agents/agentprofile/{demo.pk}/change/", {**form(demo, []), field: value})
    assert response.status_code == 200 and message in response.content.decode()
    assert getattr(AgentProfile.objects.get(pk=demo.pk), field) == before


def test_known_names_mcp_patterns_and_an_empty_tools_box_are_saved(admin_client: Client) -> None:
    McpServer.objects.create(name="crm", transport="stdio", command="crm-server")
    demo = AgentProfile.objects.get(name="demo")
    url = f"/admin/agents/agentprofile/{demo.pk}/change/"
    data = {**form(demo, []), "tools": '["kb_search", "refund", "crm__*"]', "always_ask_tools": '["crm__*"]'}
    assert admin_client.post(url, data).status_code == 302
    assert AgentProfile.objects.get(pk=demo.pk).tools == ["kb_search", "refund", "crm__*"]
    # An empty box is every registered tool, as the field's help says.
    assert admin_client.post(url, {**data, "tools": "", "always_ask_tools": "[]"}).status_code == 302
    assert AgentProfile.objects.get(pk=demo.pk).tool_names() is None


def test_full_clean_names_every_broken_field(defaults: None) -> None:
    demo = AgentProfile.objects.get(name="demo")
    demo.limits, demo.tools, demo.denied_tools = {"max_steps": "many"}, "kb_search", ["nope"]
    with pytest.raises(ValidationError) as refused:
        demo.full_clean()
    assert set(refused.value.message_dict) == {"limits", "tools", "denied_tools"}
    assert refused.value.message_dict["limits"] == ["max_steps must be a whole number of at least 1, not 'many'"]


@pytest.fixture
def broken(defaults: None) -> AgentProfile:
    """The demo profile broken by a raw update, as an old row or a script leaves it."""
    AgentProfile.objects.filter(name="demo").update(limits={"max_steps": "many"})
    return AgentProfile.objects.get(name="demo")


def test_a_broken_profile_is_unavailable_on_the_launch_form_and_the_others_launch(broken: AgentProfile, lena) -> None:
    client = client_for(lena)
    page = client.get("/runs/new/")
    assert page.status_code == 200
    html = page.content.decode()
    reason = "the agent profile &#x27;demo&#x27; is misconfigured: its limits: max_steps must be"
    assert f"Cannot be launched: {reason}" in html
    assert 'value="demo" data-provider="demo" disabled' in html
    assert 'value="scripted" data-provider="scripted" checked' in html
    response = csrf_post(client, "/runs/new/", {"agent": "demo", "task": "hi", "approver": "human"})
    assert response.status_code == 400 and "its limits: max_steps must be" in response.content.decode()
    launched = csrf_post(
        client, "/runs/new/",
        {"agent": "scripted", "task": "hi", "approver": "human", "script": json.dumps([{"final": "ok"}])},
    )
    assert launched.status_code == 302


def test_a_launch_of_a_broken_profile_answers_409_naming_its_field(broken: AgentProfile, api) -> None:
    response = api("lena").post("/api/runs", {"agent": "demo", "task": "hi"})
    assert response.status_code == 409
    assert response.data["error"] == "invalid_profile"
    assert "'demo' is misconfigured: its limits: max_steps must be a whole number" in response.data["detail"]
    other = api("lena").post("/api/runs", {"agent": "scripted", "task": "hi", "script": [{"final": "ok"}]})
    assert other.status_code == 201


def test_manage_py_check_lists_the_rows_that_no_longer_validate(broken: AgentProfile) -> None:
    AgentProfile.objects.filter(name="scripted").update(always_ask_tools=["gone_tool"])
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    assert "airlock.W001" in text
    assert "agent profile 'demo': limits: max_steps must be a whole number of at least 1, not 'many'" in text
    assert "agent profile 'scripted': always_ask_tools: no tool named 'gone_tool'" in text


def test_with_scripted_runs_off_the_check_leaves_the_scripted_profile_alone(defaults: None, settings) -> None:
    """Its diagnostic tools are registered only with scripted runs on, and it cannot launch."""
    settings.AIRLOCK_ALLOW_SCRIPTED = False
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "airlock.W001" not in out.getvalue() + err.getvalue()
    scripted = AgentProfile.objects.get(name="scripted")
    assert "always_ask_tools" in scripted.problems() or "tools" in scripted.problems()
