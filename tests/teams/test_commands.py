"""The teams commands (docs/teams.md): projects, members, a profile's project, and
tokens and webhooks limited to a project. Unknown names fail with a CommandError naming
them, and change nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from agents import access
from agents.models import AgentProfile, ApiToken, Membership, Project, Webhook
from tests.helpers import person

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def roles_of(username: str, slug: str) -> set[str]:
    return set(Membership.objects.filter(user__username=username, project__slug=slug).values_list("role", flat=True))


def test_create_project_makes_it_and_refuses_a_second_or_a_bad_slug(defaults) -> None:
    assert "created project support (Support desk)" in run("create_project", "support", "--name", "Support desk")
    assert Project.objects.get(slug="support").name == "Support desk"
    with pytest.raises(CommandError, match="project 'support' exists already"):
        run("create_project", "support")
    with pytest.raises(CommandError, match="'no spaces' is not a slug"):
        run("create_project", "no spaces")
    assert Project.objects.filter(slug="support").count() == 1


def test_add_member_and_remove_member_change_roles_one_or_all(defaults) -> None:
    person("sue")
    run("create_project", "support")
    assert run("add_member", "support", "sue", "reviewer").strip() == "sue is reviewer in support"
    assert "(already was)" in run("add_member", "support", "sue", "reviewer")
    run("add_member", "support", "sue", "launcher")
    run("add_member", "support", "sue", "admin")
    assert roles_of("sue", "support") == {"reviewer", "launcher", "admin"}
    assert Membership.objects.get(user__username="sue", role="admin").user.is_staff  # the admin site lets her in
    assert "removed the launcher role of sue in support (1 membership(s))" in run(
        "remove_member", "support", "sue", "launcher"
    )
    assert roles_of("sue", "support") == {"reviewer", "admin"}
    assert "removed every role of sue in support (2 membership(s))" in run("remove_member", "support", "sue")
    assert roles_of("sue", "support") == set()
    assert not User.objects.get(username="sue").is_staff  # the last admin role went, and staff with it


def test_staff_status_stays_while_an_admin_role_is_left_and_a_superuser_keeps_it(defaults) -> None:
    person("sue")
    person("root", superuser=True)
    run("create_project", "support")
    run("create_project", "finance")
    run("add_member", "support", "sue", "admin")
    run("add_member", "finance", "sue", "admin")
    run("remove_member", "support", "sue", "admin")
    assert User.objects.get(username="sue").is_staff  # still finance's admin
    run("remove_member", "finance", "sue", "admin")
    assert not User.objects.get(username="sue").is_staff
    run("add_member", "support", "root", "admin")
    run("remove_member", "support", "root", "admin")
    assert User.objects.get(username="root").is_staff


@pytest.mark.parametrize(
    "args, message",
    [
        (("add_member", "nowhere", "sue", "reviewer"), "no project 'nowhere' \\(known: default, support\\)"),
        (("add_member", "support", "ghost", "reviewer"), "no user named 'ghost'"),
        (("add_member", "support", "sue", "boss"), "no role 'boss' \\(roles: reviewer, operator, launcher, admin\\)"),
        (("remove_member", "nowhere", "sue"), "no project 'nowhere'"),
        (("remove_member", "support", "ghost"), "no user named 'ghost'"),
        (("remove_member", "support", "sue", "boss"), "no role 'boss'"),
        (("set_profile_project", "nobody-bot", "support"), "no agent profile named 'nobody-bot'"),
        (("set_profile_project", "demo", "nowhere"), "no project 'nowhere'"),
        (("create_api_token", "sue", "--project", "nowhere"), "no project 'nowhere'"),
        (("add_webhook", "https://hooks.example.org/x", "--events", "run.done", "--project", "nowhere"),
         "no project 'nowhere'"),
    ],
)
def test_unknown_names_are_command_errors_naming_them(defaults, args, message) -> None:
    person("sue")
    Project.objects.create(slug="support")
    Project.default_pk()
    before = (Membership.objects.count(), ApiToken.objects.count(), Webhook.objects.count(),
              list(AgentProfile.objects.values_list("name", "project_id").order_by("name")))
    with pytest.raises(CommandError, match=message):
        run(*args)
    after = (Membership.objects.count(), ApiToken.objects.count(), Webhook.objects.count(),
             list(AgentProfile.objects.values_list("name", "project_id").order_by("name")))
    assert after == before


def test_set_profile_project_moves_the_profile_and_its_runs(defaults, launch, lena) -> None:
    run_ = launch([{"final": "hi"}], agent="scripted", user=lena)
    run("create_project", "support")
    assert "agent profile scripted is in project support" in run("set_profile_project", "scripted", "support")
    support = Project.objects.get(slug="support")
    assert AgentProfile.objects.get(name="scripted").project == support
    assert access.project_of(type(run_).objects.get(pk=run_.pk)) == support.pk


def test_a_project_limited_token_from_the_command_reaches_only_that_project(teams, pending) -> None:
    """fay reviews finance; she is also given review in support, then a token limited to finance."""
    Membership.objects.create(project=teams["support"].project, user=teams["finance"]["reviewer"], role="reviewer")
    support = pending(user=teams["support"]["launcher"], agent="support-bot")
    finance = pending(user=teams["finance"]["launcher"], agent="finance-bot")
    out = run("create_api_token", "fay", "--project", "finance")
    assert "limited to project finance" in out
    raw = out.strip().splitlines()[-1]
    assert ApiToken.objects.get(prefix=raw[:14]).project == teams["finance"].project
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    assert [a["id"] for a in api.get("/api/approvals").json()["items"]] == [finance.pk]
    assert api.get(f"/api/runs/{support.run_id}").status_code == 404
    refused = api.post(f"/api/approvals/{support.pk}/decision", '{"decision": "approve"}',
                       content_type="application/json")
    assert refused.status_code == 404
    # Her unlimited token reaches both projects.
    whole = run("create_api_token", "fay").strip().splitlines()[-1]
    both = Client(headers={"Authorization": f"Bearer {whole}"}).get("/api/approvals").json()["items"]
    assert {a["id"] for a in both} == {support.pk, finance.pk}


def test_add_webhook_with_a_project_belongs_to_it_and_without_to_every_project(defaults) -> None:
    run("create_project", "support")
    out = run("add_webhook", "https://hooks.example.org/a", "--events", "run.done", "--project", "support")
    assert "of project support" in out and out.strip().splitlines()[-1].startswith("whsec_")
    assert Webhook.objects.get(url="https://hooks.example.org/a").project.slug == "support"
    assert "of every project" in run("add_webhook", "https://hooks.example.org/b", "--events", "run.done")
    assert Webhook.objects.get(url="https://hooks.example.org/b").project is None
