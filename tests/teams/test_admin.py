"""Project admins in the Django admin: they manage their projects' profiles, webhooks
and members, see nothing of another project's, and cannot move a row out of theirs.
Superusers see all."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents.models import AgentProfile, Membership, Project, Webhook
from agents.notifications import delivery as notify
from tests.helpers import member, person

pytestmark = pytest.mark.django_db


def admin_client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def hooks(teams: dict[str, Any]) -> dict[str, Webhook]:
    return {
        slug: Webhook.objects.create(url=f"https://hooks.example.org/{slug}", events=["run.done"],
                                     secret=notify.new_secret(), project=team.project)
        for slug, team in teams.items()
    }


def test_a_project_admin_lists_only_their_projects_rows(teams, hooks) -> None:
    sam = admin_client(teams["support"]["admin"])
    assert sam.get("/admin/").status_code == 200
    profiles = sam.get("/admin/agents/agentprofile/").content.decode()
    assert "support-bot" in profiles and "finance-bot" not in profiles and ">demo<" not in profiles
    webhooks = sam.get("/admin/agents/webhook/").content.decode()
    assert f"/admin/agents/webhook/{hooks['support'].pk}/change/" in webhooks
    assert f"/admin/agents/webhook/{hooks['finance'].pk}/change/" not in webhooks
    projects = sam.get("/admin/agents/project/").content.decode()
    assert "support" in projects and "finance" not in projects
    # Another project's rows are not there at all (the admin's "does not exist" redirect).
    finance_bot = AgentProfile.objects.get(name="finance-bot")
    assert sam.get(f"/admin/agents/agentprofile/{finance_bot.pk}/change/").status_code == 302
    assert sam.get(f"/admin/agents/project/{teams['finance'].project.pk}/change/").status_code == 302
    # Nothing beyond: users, tokens and MCP servers stay with superusers.
    for path in ("/admin/auth/user/", "/admin/agents/apitoken/", "/admin/agents/mcpserver/"):
        assert sam.get(path).status_code == 403, path


def test_a_project_admin_adds_a_member_to_their_project_only(teams) -> None:
    sam = admin_client(teams["support"]["admin"])
    newcomer = person("newcomer")
    support = teams["support"].project
    page = sam.get(f"/admin/agents/project/{support.pk}/change/")
    assert page.status_code == 200
    form = {
        "name": "Support", "memberships-TOTAL_FORMS": "1", "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000",
        "memberships-0-user": str(newcomer.pk), "memberships-0-role": "reviewer",
    }
    assert sam.post(f"/admin/agents/project/{support.pk}/change/", form).status_code == 302
    assert Membership.objects.filter(project=support, user=newcomer, role="reviewer").exists()
    # Through the memberships list, finance is not a choice: the form refuses it.
    refused = sam.post("/admin/agents/membership/add/", {
        "project": str(teams["finance"].project.pk), "user": str(newcomer.pk), "role": "reviewer",
    })
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert not Membership.objects.filter(project=teams["finance"].project, user=newcomer).exists()


def test_a_project_admin_cannot_move_a_profile_to_another_project(teams) -> None:
    sam = admin_client(teams["support"]["admin"])
    profile = AgentProfile.objects.get(name="support-bot")
    page = sam.get(f"/admin/agents/agentprofile/{profile.pk}/change/").content.decode()
    assert 'name="project"' in page and f'value="{teams["finance"].project.pk}"' not in page
    assert AgentProfile.objects.get(pk=profile.pk).project == teams["support"].project


def test_superusers_see_every_project_and_only_they_make_projects(teams, hooks) -> None:
    root = admin_client(person("root", superuser=True))
    profiles = root.get("/admin/agents/agentprofile/").content.decode()
    assert "support-bot" in profiles and "finance-bot" in profiles
    assert root.get("/admin/agents/project/add/").status_code == 200
    assert admin_client(teams["support"]["admin"]).get("/admin/agents/project/add/").status_code == 403


def test_a_staff_member_without_an_admin_role_manages_nothing(teams) -> None:
    staff = member("stella", teams["support"].project, "reviewer", staff=True)
    client = admin_client(staff)
    assert client.get("/admin/agents/agentprofile/").status_code == 403
    assert client.get("/admin/agents/project/").status_code == 403
    assert Project.objects.count() == 3  # default, support, finance: nothing changed
