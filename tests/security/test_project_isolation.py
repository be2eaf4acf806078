"""Two teams on one deployment: every page and API endpoint, for the members of the
project that owns an object and for the same roles in the other project.

The expected statuses are written out by hand from docs/teams.md (not computed from
the code): a person with no role in a run's project gets 404 where its run, call,
timeline, export, external calls or gateway profile would be, exactly as for an object
that does not exist; lists, exports, counts and the badge leave the other project's
objects out. People hold their roles through memberships only, no global group.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from agents.actions.runs import run_launch
from agents.actions.tokens import token_create
from agents.models import Approval, Membership, Run
from tests.helpers import counts, final, requires_postgres
from tests.security.test_authorization import page_client

pytestmark = pytest.mark.django_db

# Columns: the owning project's reviewer, operator and launcher (who launched the run),
# then the same roles in the other project.
COLUMNS = ("reviewer", "operator", "launcher")
MATRIX_ROLES = [("own", r) for r in COLUMNS] + [("other", r) for r in COLUMNS]

# fmt: off
#            name                        method  path                                   own: rev  op   lau  other: rev  op   lau
PAGES = [
    ("timeline",                         "GET",  "/runs/{run}/",                        (200, 200, 200, 404, 404, 404)),
    ("timeline live poll",               "GET",  "/runs/{run}/?live=1&after=0",         (200, 200, 200, 404, 404, 404)),
    ("task as text",                     "GET",  "/runs/{run}/task.txt",                (200, 200, 200, 404, 404, 404)),
    ("export",                           "GET",  "/runs/{run}/export/",                 (200, 200, 200, 404, 404, 404)),
    ("cancel",                           "POST", "/runs/{run}/cancel/",                 (403, 302, 403, 404, 404, 404)),
    ("hold",                             "POST", "/runs/{run}/hold/",                   (403, 302, 403, 404, 404, 404)),
    ("save as eval case",                "POST", "/runs/{run}/eval-case/",              (403, 302, 403, 404, 404, 404)),
    ("approval page",                    "GET",  "/reviews/{a}/",                       (200, 200, 200, 404, 404, 404)),
    ("approve",                          "POST", "/reviews/{a}/approve/",               (303, 403, 403, 404, 403, 403)),
    ("reject",                           "POST", "/reviews/{a}/reject/",                (303, 403, 403, 404, 403, 403)),
]

API = [
    ("run",                              "GET",  "/api/runs/{run}",                     (200, 200, 200, 404, 404, 404)),
    ("transitions",                      "GET",  "/api/runs/{run}/transitions",         (200, 200, 200, 404, 404, 404)),
    ("cancel",                           "POST", "/api/runs/{run}/cancel",              (403, 200, 403, 403, 404, 403)),
    ("hold",                             "POST", "/api/runs/{run}/hold",                (403, 200, 403, 403, 404, 403)),
    ("decide",                           "POST", "/api/approvals/{a}/decision",         (200, 403, 403, 404, 403, 403)),
    # The other project's agent is answered as an unknown agent (400), naming none of its profiles.
    ("launch the project's agent",       "POST", "/api/runs",                           (403, 403, 201, 403, 403, 400)),
    ("propose an external call",         "POST", "/api/runs/{ext}/calls",               (403, 403, 200, 404, 404, 404)),
    ("read an external call",            "GET",  "/api/runs/{ext}/calls/{key}",         (403, 403, 200, 404, 404, 404)),
    ("finish an external run",           "POST", "/api/runs/{ext}/finish",              (403, 403, 200, 404, 404, 404)),
]
# fmt: on

BODIES = {
    "/runs/{run}/cancel/": {"reason": "matrix"},
    "/runs/{run}/hold/": {"reason": "matrix"},
    "/reviews/{a}/approve/": {"note": "matrix"},
    "/reviews/{a}/reject/": {"note": "matrix"},
    "/api/runs/{run}/hold": {"reason": "matrix"},
    "/api/approvals/{a}/decision": {"decision": "approve", "note": "matrix"},
    "/api/runs/{ext}/calls": {"tool": "echo", "args": {"text": "hi"}},
    "/api/runs/{ext}/finish": {"answer": "done"},
}


@pytest.fixture(autouse=True)
def evals_dir(settings: Any, tmp_path: Any) -> None:
    settings.AIRLOCK_EVALS_DIR = tmp_path / "evals"


def objects(team: Any, pending: Any) -> dict[str, Any]:
    """A run of `team` waiting for a reviewer, its approval, and an external run of the
    team's with one call proposed (its key), all launched by the team's launcher."""
    approval = pending(user=team["launcher"], agent=team.profile.name)
    ext = run_launch(agent=team.external.name, task="tidy", user=team["launcher"])
    _t, raw = token_create(user=team["launcher"])
    proposed = Client(headers={"Authorization": f"Bearer {raw}"}).post(
        f"/api/runs/{ext.pk}/calls", json.dumps({"tool": "echo", "args": {"text": "first"}}),
        content_type="application/json",
    )
    assert proposed.status_code == 200, proposed.content
    return {"run": approval.run_id, "a": approval.pk, "ext": ext.pk, "key": proposed.json()["key"],
            "profile": team.profile.name}


def people_for(teams: dict[str, Any], owner: str) -> dict[tuple[str, str], Any]:
    other = "finance" if owner == "support" else "support"
    return {("own", r): teams[owner][r] for r in COLUMNS} | {("other", r): teams[other][r] for r in COLUMNS}


def check(row: tuple[Any, ...], *, api: bool, owner: str, teams: dict[str, Any], pending: Any) -> None:
    name, method, template, expected = row
    who = people_for(teams, owner)
    seen = {}
    ids = None
    for column in MATRIX_ROLES:
        if ids is None or method != "GET":
            ids = objects(teams[owner], pending)  # fresh objects after anything that may change them
        path = template.format(**ids)
        body = BODIES.get(template)
        if template == "/api/runs":
            body = {"agent": ids["profile"], "task": "t", "script": [final("hi")]}
        before = counts()
        if api:
            _t, raw = token_create(user=who[column])
            client = Client(enforce_csrf_checks=True, headers={"Authorization": f"Bearer {raw}"})
            data = json.dumps(body) if body is not None else ""
            response = client.generic(method, path, data, content_type="application/json")
            assert response["Content-Type"].startswith("application/json"), (column, name)
        else:
            client = page_client(who[column])
            response = client.post(path, body or {}) if method == "POST" else client.get(path)
        seen[column] = response.status_code
        if response.status_code >= 400:
            assert counts() == before, (column, name, "a refused request changed rows")
        if response.status_code == 404 and api:
            # Exactly the answer for an object that does not exist: nothing of it shows.
            assert response.json()["error"] == "not_found", (column, name)
    assert tuple(seen[c] for c in MATRIX_ROLES) == expected, f"{name} ({owner}'s): {seen}"


@pytest.mark.parametrize("owner", ["support", "finance"])
@pytest.mark.parametrize("row", PAGES, ids=[f"{m} {p}" for _, m, p, _ in PAGES])
def test_pages_answer_members_and_outsiders_as_the_table_says(row, owner, teams, pending) -> None:
    check(row, api=False, owner=owner, teams=teams, pending=pending)


@pytest.mark.parametrize("owner", ["support", "finance"])
@pytest.mark.parametrize("row", API, ids=[f"{m} {p}" for _, m, p, _ in API])
def test_api_answers_members_and_outsiders_as_the_table_says(row, owner, teams, pending) -> None:
    check(row, api=True, owner=owner, teams=teams, pending=pending)


def _secret_objects(teams: dict[str, Any], pending: Any) -> dict[str, Approval]:
    """A pending call in each project whose task and arguments name the project."""
    made = {}
    for slug, team in teams.items():
        a = pending(user=team["launcher"], agent=team.profile.name, task=f"task of {slug.upper()}-ONLY")
        Approval.objects.filter(pk=a.pk).update(args={"entry": f"{slug.upper()}-ONLY"})
        made[slug] = a
    return made


@pytest.mark.parametrize("role", ["reviewer", "operator", "launcher"])
def test_lists_counts_badge_and_export_show_only_the_members_project(role, teams, pending) -> None:
    made = _secret_objects(teams, pending)
    for slug, team in teams.items():
        other = "finance" if slug == "support" else "support"
        mine, theirs = made[slug], made[other]
        page = page_client(team[role])
        _t, raw = token_create(user=team[role])
        api = Client(headers={"Authorization": f"Bearer {raw}"})
        texts = {url: page.get(url).content.decode() for url in
                 ["/", "/runs/", "/reviews/", "/reviews/list/", "/reviews/badge/", "/runs/new/"]}
        texts |= {url: api.get(url).content.decode() for url in
                  ["/api/runs", "/api/approvals", "/api/approvals?status=pending"]}
        texts["export"] = b"".join(api.get("/api/runs/export?transitions=1").streaming_content).decode()
        leaked = [url for url, text in texts.items() if f"{other.upper()}-ONLY" in text or f"{other}-bot" in text]
        assert leaked == [], (role, slug)
        assert [r["id"] for r in api.get("/api/runs").json()["items"]] == [mine.run_id]
        lines = b"".join(api.get("/api/runs/export").streaming_content).splitlines()
        assert [json.loads(line)["id"] for line in lines] == [mine.run_id]
        assert [a["id"] for a in api.get("/api/approvals").json()["items"]] == [mine.pk]
        assert f"/runs/{mine.run_id}/" in texts["/runs/"] and f"/runs/{theirs.run_id}/" not in texts["/runs/"]
        cards = {int(n) for n in re.findall(r'data-approval-id="(\d+)"', texts["/reviews/"])}
        assert cards == {mine.pk}, (role, slug)
        assert 'data-count="1"' in texts["/reviews/badge/"], texts["/reviews/badge/"]  # one call, not two


def test_the_overview_counts_only_the_members_project(teams, pending) -> None:
    _secret_objects(teams, pending)
    pending(user=teams["finance"]["launcher"], agent="finance-bot")  # finance now has two waiting
    html = page_client(teams["support"]["reviewer"]).get("/").content.decode()
    assert "1 pending approval " in html and "FINANCE-ONLY" not in html
    html = page_client(teams["finance"]["reviewer"]).get("/").content.decode()
    assert "2 pending approvals" in html and "SUPPORT-ONLY" not in html


def test_a_global_group_still_sees_every_project(teams, pending, people) -> None:
    made = _secret_objects(teams, pending)
    _t, raw = token_create(user=people["reviewer"])  # rita: the global `reviewer` group
    listed = Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/approvals").json()["items"]
    assert {a["id"] for a in listed} >= {made["support"].pk, made["finance"].pk}


def test_a_project_limited_token_reaches_only_its_project(teams, pending) -> None:
    """Even a superuser's token, limited to support, cannot read or decide finance's calls."""
    from agents.models import Project
    from tests.helpers import person

    made = _secret_objects(teams, pending)
    boss = person("boss", superuser=True)
    support = Project.objects.get(slug="support")
    _t, limited = token_create(user=boss, project=support)
    api = Client(headers={"Authorization": f"Bearer {limited}"})
    fin = made["finance"]
    assert [r["id"] for r in api.get("/api/runs").json()["items"]] == [made["support"].run_id]
    assert api.get(f"/api/runs/{fin.run_id}").status_code == 404
    decided = api.post(f"/api/approvals/{fin.pk}/decision", json.dumps({"decision": "approve"}),
                       content_type="application/json")
    assert decided.status_code == 404
    assert Approval.objects.get(pk=fin.pk).status == "pending"
    launched = api.post("/api/runs", json.dumps({"agent": "finance-bot", "task": "t", "script": [final()]}),
                        content_type="application/json")
    assert launched.status_code == 400 and launched.json()["error"] == "unknown_agent"
    assert "finance-ext" not in launched.content.decode()  # the known agents are its own project's
    assert not Run.objects.filter(profile__name="finance-bot", created_by=boss).exists()
    # The same user's unlimited token reaches both.
    _t, whole = token_create(user=boss)
    assert Client(headers={"Authorization": f"Bearer {whole}"}).get(f"/api/runs/{fin.run_id}").status_code == 200


def test_a_launcher_who_also_reviews_in_the_project_cannot_approve_their_own_run(teams, pending) -> None:
    """Separation of duties with memberships only: sid launches and reviews in support."""
    from agents.models import AgentProfile

    team = teams["support"]
    AgentProfile.objects.filter(pk=team.profile.pk).update(separate_duties=True)
    Membership.objects.create(project=team.project, user=team["launcher"], role="reviewer")
    own = pending(user=team["launcher"], agent=team.profile.name)
    _t, raw = token_create(user=team["launcher"])
    answer = Client(headers={"Authorization": f"Bearer {raw}"}).post(
        f"/api/approvals/{own.pk}/decision", json.dumps({"decision": "approve"}), content_type="application/json"
    )
    assert answer.status_code == 403 and answer.json()["error"] == "separation_of_duties"
    page = page_client(team["launcher"]).post(f"/reviews/{own.pk}/approve/", {"note": "mine"})
    assert page.status_code == 403
    assert Approval.objects.get(pk=own.pk).status == "pending"
    # Another reviewer of the project may.
    assert page_client(team["reviewer"]).post(f"/reviews/{own.pk}/approve/", {}).status_code == 303
    assert Approval.objects.get(pk=own.pk).status == "approved"


def test_a_person_in_no_project_sees_an_empty_dashboard_that_says_so(teams, pending) -> None:
    from tests.helpers import person

    _secret_objects(teams, pending)
    nobody = page_client(person("newcomer"))
    overview = nobody.get("/")
    assert overview.status_code == 200
    html = overview.content.decode()
    assert "You are not a member of any project yet; ask an admin." in html
    assert "ONLY" not in html
    runs = nobody.get("/runs/")
    assert runs.status_code == 200 and "ONLY" not in runs.content.decode()
    assert 'data-approval-id="' not in nobody.get("/reviews/").content.decode()
    # A member is not told so.
    assert "not a member of any project" not in page_client(teams["support"]["reviewer"]).get("/").content.decode()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pytest", "version": "1"}}}


@requires_postgres()
@pytest.mark.django_db(transaction=True)  # the gateway reads on its own threads: rows must be committed
def test_the_gateway_answers_another_projects_profile_as_missing(teams) -> None:
    from agents.models import GatewaySession

    def initialize(user: Any, profile: str, **token: Any) -> int:
        _t, raw = token_create(user=user, **token)
        response = Client().post(
            f"/mcp/{profile}/", data=json.dumps(INIT), content_type="application/json",
            HTTP_ACCEPT="application/json, text/event-stream", HTTP_AUTHORIZATION=f"Bearer {raw}",
        )
        return response.status_code

    support, finance = teams["support"], teams["finance"]
    seen = {
        "support launcher": initialize(support["launcher"], "support-ext"),
        "support reviewer": initialize(support["reviewer"], "support-ext"),
        "finance launcher": initialize(finance["launcher"], "support-ext"),
        "finance reviewer": initialize(finance["reviewer"], "support-ext"),
        "a missing profile": initialize(support["launcher"], "nobody-ext"),
    }
    assert seen == {"support launcher": 200, "support reviewer": 403, "finance launcher": 404,
                    "finance reviewer": 404, "a missing profile": 404}
    # A launcher of both projects with a token limited to finance: support's profile is missing.
    Membership.objects.create(project=finance.project, user=support["launcher"], role="launcher")
    assert initialize(support["launcher"], "support-ext", project=finance.project) == 404
    assert initialize(support["launcher"], "finance-ext", project=finance.project) == 200
    assert GatewaySession.objects.filter(user__in=[finance["launcher"], finance["reviewer"]]).count() == 0


def test_a_card_offers_its_buttons_only_where_the_viewer_reviews(teams, pending) -> None:
    """sue reviews support and launches in finance: her finance run's call is hers to
    read, not to answer."""
    sue = teams["support"]["reviewer"]
    Membership.objects.create(project=teams["finance"].project, user=sue, role="launcher")
    theirs = pending(user=teams["support"]["launcher"], agent="support-bot")
    mine = pending(user=sue, agent="finance-bot")
    html = page_client(sue).get("/reviews/").content.decode()
    cards = dict(re.findall(r'data-approval-id="(\d+)"(.*?)</article>', html, re.S))
    assert set(cards) == {str(theirs.pk), str(mine.pk)}
    assert 'name="Approve"' in cards[str(theirs.pk)] or ">Approve<" in cards[str(theirs.pk)]
    assert ">Approve<" not in cards[str(mine.pk)]
    assert "its reviewers approve or reject it" in cards[str(mine.pk)]
    assert page_client(sue).post(f"/reviews/{mine.pk}/approve/", {}).status_code == 403
    assert Approval.objects.get(pk=mine.pk).status == "pending"
