from __future__ import annotations

import json
import re

import pytest
from django.test import override_settings

from agents.engine.limits import DEFAULTS, TASK_MAX_CHARS
from agents.models import Run, Transition
from agents.web.forms import LIMITS
from tests.helpers import client_for, csrf_post, person

pytestmark = pytest.mark.django_db

SCRIPT = json.dumps([{"call": {"tool": "echo", "args": {"text": "hi"}}}, {"final": "done"}])


def form(**overrides):
    data = {"agent": "scripted", "task": "say hi", "approver": "human", "script": SCRIPT}
    data.update(overrides)
    return data


def test_launcher_sees_profiles_with_description_model_and_tools(lena) -> None:
    html = client_for(lena).get("/runs/new/").content.decode()
    assert "A help-desk agent with an offline, deterministic planner" in html
    assert "demo-planner" in html and "<code>fetch_fixture</code>" in html
    assert 'name="script"' in html and 'name="max_steps"' in html


def test_launch_redirects_to_the_new_runs_timeline(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(max_steps="5", approver="none"))
    run = Run.objects.get()
    assert response.status_code == 302 and response.url == f"/runs/{run.pk}/"
    assert (run.created_by.username, run.task, run.approver, run.state) == ("lena", "say hi", "none", "queued")
    assert run.engine["limits"]["max_steps"] == 5
    assert run.script[1] == {"final": "done"}
    assert Transition.objects.get(run=run).actor == "user:lena"


def test_looser_limits_are_refused_on_the_field(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(max_steps="500"))
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.exists()
    assert '<p class="error" id="max_steps-error">max_steps may only tighten the profile&#x27;s 20, not 500</p>' in html
    field = re.search(r'<input[^>]*id="id_max_steps"[^>]*>', html).group(0)
    assert 'value="500"' in field and 'aria-invalid="true"' in field and 'aria-describedby="max_steps-help max_steps-error"' in field
    assert "say hi" in html  # what was typed stays


def test_empty_task_is_refused_inline(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(task="   "))
    assert response.status_code == 400 and not Run.objects.exists()
    assert '<p class="error" id="task-error">the task must be non-empty text</p>' in response.content.decode()


def test_bad_script_json_is_refused_inline(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(script='[{"final": "x"'))
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.exists()
    assert '<p class="error" id="script-error">not valid JSON' in html


def test_script_of_the_wrong_shape_is_refused_inline(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(script='[{"say": "x"}]'))
    assert response.status_code == 400 and not Run.objects.exists()
    assert "script item 0 needs exactly one of" in response.content.decode()


def test_demo_profile_ignores_the_hidden_script_box(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(agent="demo"))
    run = Run.objects.get()
    assert response.status_code == 302 and run.profile.name == "demo" and run.script is None


def test_unknown_agent_is_refused(lena) -> None:
    response = csrf_post(client_for(lena), "/runs/new/", form(agent="nope"))
    assert response.status_code == 400 and not Run.objects.exists()


@override_settings(AIRLOCK_ALLOW_SCRIPTED=False)
def test_without_scripted_runs_the_form_offers_no_script(lena) -> None:
    html = client_for(lena).get("/runs/new/").content.decode()
    assert 'name="script"' not in html and 'value="scripted"' not in html
    response = csrf_post(client_for(lena), "/runs/new/", form())
    assert response.status_code == 400 and not Run.objects.exists()


def test_operator_cannot_launch_unless_also_launcher(otto, defaults) -> None:
    c = client_for(otto)
    assert c.get("/runs/new/").status_code == 403
    assert csrf_post(c, "/runs/new/", form()).status_code == 403
    assert not Run.objects.exists()
    both = person("olive", "operator", "launcher")
    assert csrf_post(client_for(both), "/runs/new/", form()).status_code == 302


def test_launch_without_csrf_token_is_refused(lena) -> None:
    response = client_for(lena).post("/runs/new/", form())
    assert response.status_code == 403 and not Run.objects.exists()


def test_launch_form_needs_login_and_refuses_put(client, lena) -> None:
    assert client.get("/runs/new/").status_code == 302
    assert client_for(lena, csrf=False).put("/runs/new/").status_code == 405


def test_nav_shows_launch_only_to_launchers(lena, otto) -> None:
    assert b'href="/runs/new/"' in client_for(lena).get("/runs/").content
    assert b'href="/runs/new/"' not in client_for(otto).get("/runs/").content


def test_demo_scenarios_are_offered_and_launch_in_one_click(defaults) -> None:
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from agents.demo import SCENARIOS
    from agents.models import Run

    user = User.objects.create_user("lena")
    user.groups.add(Group.objects.get(name="launcher"))
    client = Client(enforce_csrf_checks=False)
    client.force_login(user)
    page = client.get("/runs/new/").content.decode()
    for scenario in SCENARIOS:
        assert f"Launch scenario: {scenario['title']}" in page
    refund = next(s for s in SCENARIOS if s["name"] == "refund-request")
    response = client.post("/runs/new/", {"agent": "demo", "task": refund["task"], "approver": "human"})
    run = Run.objects.get()
    assert response.status_code == 302 and response.url == f"/runs/{run.pk}/"
    assert run.profile.name == "demo" and run.task == refund["task"] and run.created_by == user


def test_a_launch_policy_tightens_the_run(lena) -> None:
    policy = {"rules": [{"tool": "echo", "then": "ask", "reason": "watch this one"}], "irreversible_approvals": 2}
    response = csrf_post(client_for(lena), "/runs/new/", form(policy=json.dumps(policy)))
    run = Run.objects.get()
    assert response.status_code == 302
    assert run.policy()["rules"] == [{**policy["rules"][0], "origin": "launch", "index": 1}]
    assert run.policy()["irreversible_approvals"] == 2


def test_a_looser_launch_policy_is_refused_on_the_field(lena) -> None:
    policy = {"rules": [{"tool": "echo", "then": "allow", "reason": "fine"}]}
    response = csrf_post(client_for(lena), "/runs/new/", form(policy=json.dumps(policy)))
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.exists()
    assert '<p class="error" id="policy-error">policy.rules[1].then: must be ask or deny (launch rules only tighten)' in html
    bad_json = csrf_post(client_for(lena), "/runs/new/", form(policy="{rules"))
    assert bad_json.status_code == 400 and '<p class="error" id="policy-error">not valid JSON' in bad_json.content.decode()


def test_a_task_over_the_limit_is_refused_inline_and_one_at_the_limit_launches(lena) -> None:
    client = client_for(lena)
    response = csrf_post(client, "/runs/new/", form(task="x" * (TASK_MAX_CHARS + 1)))
    assert response.status_code == 400 and not Run.objects.exists()
    assert (
        f'<p class="error" id="task-error">the task is {TASK_MAX_CHARS + 1:,} characters; at most {TASK_MAX_CHARS:,} '
        "are taken</p>"
    ) in response.content.decode()
    assert csrf_post(client, "/runs/new/", form(task="x" * TASK_MAX_CHARS)).status_code == 302
    assert len(Run.objects.get().task) == TASK_MAX_CHARS


def test_a_scripted_run_with_an_empty_script_is_refused_at_launch(lena) -> None:
    for script in ("", "[]"):
        response = csrf_post(client_for(lena), "/runs/new/", form(script=script))
        assert response.status_code == 400 and not Run.objects.exists()
        assert (
            '<p class="error" id="script-error">the scripted agent needs a script: a list of at least one decision</p>'
        ) in response.content.decode()


def test_a_launch_rule_for_a_tool_the_agent_lacks_is_refused_on_the_field(lena) -> None:
    policy = json.dumps({"rules": [{"tool": "delete_account", "then": "deny", "reason": "not today"}]})
    response = csrf_post(client_for(lena), "/runs/new/", form(agent="demo", policy=policy, script=""))
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.exists()
    assert (
        '<p class="error" id="policy-error">policy.rules[1].tool: the agent has no tool named &#x27;delete_account&#x27; '
        "(its tools: export_customers, http_get, kb_search, refund, send_email)</p>"
    ) in html


def test_a_launch_history_rule_is_refused_on_the_field_the_form_names(lena) -> None:
    rule = {"tool": "echo", "then": "ask", "reason": "three echoes", "history": {"scope": "caller", "calls_over": 3}}
    response = csrf_post(client_for(lena), "/runs/new/", form(policy=json.dumps({"rules": [rule]})))
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.exists()
    assert '<p class="error" id="policy-error">policy.rules[1].history.within: a caller scope needs a window' in html
    rule["history"]["within"] = "1h"
    response = csrf_post(client_for(lena), "/runs/new/", form(policy=json.dumps({"rules": [rule]})))
    assert response.status_code == 302
    assert Run.objects.get().policy()["rules"][0]["history"] == {"scope": "caller", "within": "1h", "calls_over": 3}


def test_every_limit_has_its_words_once_for_every_form_and_page() -> None:
    assert list(LIMITS) == list(DEFAULTS)
