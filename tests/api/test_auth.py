"""Who the API knows: bearer tokens (hashed, revocable), the session with CSRF, the docs."""

from __future__ import annotations

import hashlib
import io
import logging

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import ApiToken, Run
from tests.helpers import Api, launch_body

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("POST", "/api/runs"),
    ("GET", "/api/runs/1"),
    ("GET", "/api/runs/1/transitions"),
    ("POST", "/api/runs/1/cancel"),
    ("GET", "/api/approvals?status=pending"),
    ("POST", "/api/approvals/1/decision"),
    ("GET", "/api/openapi.json"),
]


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize("header", [None, "Bearer airlock_not-a-token", "Basic bGVuYTpwdw==", "Bearer", "Token abc"])
def test_every_endpoint_needs_a_user(users, method, path, header) -> None:
    client = Api(None)
    response = client.request(method, path, launch_body(), headers={"Authorization": header} if header else {})
    assert response.status_code == 401 and response.data["error"] == "unauthenticated"
    assert "airlock_not-a-token" not in response.content.decode()
    assert Run.objects.count() == 0


def test_tokens_are_stored_as_sha256_only(users) -> None:
    token, raw = token_create(user=users["lena"])
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert not ApiToken.objects.filter(digest=raw).exists() and raw not in token.prefix


def test_revoked_token_stops_working(users, caplog) -> None:
    token, raw = token_create(user=users["lena"])
    client = Api(raw)
    assert client.post("/api/runs", launch_body()).status_code == 201
    out = io.StringIO()
    call_command("revoke_api_token", str(token.pk), stdout=out)
    assert "revoked 1 token(s)" in out.getvalue()
    with caplog.at_level(logging.DEBUG):
        response = client.post("/api/runs", launch_body())
    assert response.status_code == 401 and response.data["detail"] == "unknown or revoked API token"
    assert raw not in caplog.text  # never logged
    assert Run.objects.count() == 1


def test_revoking_all_of_a_users_tokens(users) -> None:
    raws = [token_create(user=users["lena"])[1] for _ in range(2)]
    other = token_create(user=users["leo"])[1]
    call_command("revoke_api_token", user="lena", stdout=io.StringIO())
    assert [Api(r).get("/api/approvals").status_code for r in raws] == [401, 401]
    assert Api(other).get("/api/approvals").status_code == 200


def test_inactive_users_token_stops_working(users) -> None:
    raw = token_create(user=users["lena"])[1]
    User.objects.filter(username="lena").update(is_active=False)
    assert Api(raw).get("/api/approvals").status_code == 401


def test_create_api_token_prints_a_working_token_as_its_last_line(users) -> None:
    out = io.StringIO()
    call_command("create_api_token", "lena", "--name", "ci", stdout=out)
    raw = out.getvalue().strip().splitlines()[-1]
    assert raw.startswith("airlock_") and " " not in raw
    token = ApiToken.objects.get(user__username="lena")
    assert token.name == "ci" and token.digest == hashlib.sha256(raw.encode()).hexdigest()
    response = Api(raw).post("/api/runs", launch_body(task="via a new token"))
    assert response.status_code == 201
    assert Run.objects.get(pk=response.data["id"]).created_by.username == "lena"


def test_create_api_token_for_unknown_user_fails(users) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("create_api_token", "nobody", stdout=io.StringIO())
    assert ApiToken.objects.count() == 0


def session_client(users, name: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(users[name])
    return client


def test_session_user_reads_and_posts_with_csrf(users) -> None:
    client = session_client(users, "lena")
    client.get("/")  # a page sets the csrftoken cookie (base.html puts it in hx-headers)
    token = client.cookies["csrftoken"].value
    response = client.post("/api/runs", launch_body(), content_type="application/json", headers={"X-CSRFToken": token})
    assert response.status_code == 201
    run_id = response.json()["id"]
    assert client.get(f"/api/runs/{run_id}").json()["id"] == run_id


def test_session_post_without_csrf_is_refused_in_json(users) -> None:
    client = session_client(users, "lena")
    response = client.post("/api/runs", launch_body(), content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden" and "CSRF" in response.json()["detail"]
    assert Run.objects.count() == 0


def test_bearer_post_needs_no_csrf(api) -> None:
    assert api("lena").post("/api/runs", launch_body()).status_code == 201  # Api enforces CSRF checks


def test_openapi_schema_lists_the_endpoints(api) -> None:
    response = api("nina").get("/api/openapi.json")
    assert response.status_code == 200
    paths = response.data["paths"]
    assert set(paths) >= {
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/transitions",
        "/api/runs/{run_id}/cancel",
        "/api/approvals",
        "/api/approvals/{approval_id}/decision",
    }
    assert set(paths["/api/runs"]) == {"get", "post"}
    filters = {"state", "agent", "launched_by", "since", "until", "q"}
    listed = {p["name"] for p in paths["/api/runs"]["get"]["parameters"]}
    assert listed == filters | {"after", "limit"}
    assert {p["name"] for p in paths["/api/approvals"]["get"]["parameters"]} == listed | {"status", "tool"}
    export = paths["/api/runs/export"]["get"]
    assert {p["name"] for p in export["parameters"]} == filters | {"transitions"}
    assert list(export["responses"]["200"]["content"]) == ["application/x-ndjson"]
    schemes = response.data["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} == {"http", "apiKey"}


def test_docs_are_for_logged_in_users(users) -> None:
    anonymous = Client().get("/api/docs")
    assert anonymous.status_code == 302 and anonymous.url.startswith("/login/")
    page = session_client(users, "nina").get("/api/docs")
    assert page.status_code == 200 and b"swagger-ui" in page.content


def test_admin_lists_tokens_without_the_secret_and_revokes_them(users) -> None:
    token, raw = token_create(user=users["lena"], name="laptop")
    admin = Client()
    admin.force_login(users["root"])
    page = admin.get("/admin/agents/apitoken/")
    assert page.status_code == 200 and token.prefix.encode() in page.content
    assert raw.encode() not in page.content and token.digest.encode() not in page.content
    # Made here or by command, shown once (tests/pages/test_admin_secrets.py).
    assert admin.get("/admin/agents/apitoken/add/").status_code == 200
    response = admin.post("/admin/agents/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    assert b"Revoked 1 token(s)." in response.content
    assert Api(raw).get("/api/approvals").status_code == 401


def test_an_api_path_with_a_newline_is_a_json_404(api) -> None:
    """The fuzz found it: the catch-all read `.`, which matches no newline, so
    /api/runs/%0A/calls/x fell through to Django's HTML 404."""
    response = api("root").get("/api/runs/%0A/calls/x")
    assert response.status_code == 404
    assert response.headers["Content-Type"].startswith("application/json")


def test_a_tokens_read_brings_its_users_roles_in_the_same_statement(users) -> None:
    """Every API call asks who may do what next: the token's one statement reads the
    user's groups and project roles too, and the answer is the same as a separate read."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agents import access
    from agents.actions.tokens import token_user
    from agents.models import Project
    from tests.helpers import member

    finance = Project.objects.create(name="finance")
    both = member("bea", finance, "reviewer", "operator")
    both.groups.add(*users["lena"].groups.all(), *users["rita"].groups.all())
    raw = token_create(user=both)[1]
    with CaptureQueriesContext(connection) as captured:
        user = token_user(raw)
        groups, roles = access._roles_of(user)
    reads = [q["sql"] for q in captured.captured_queries if "agents_membership" in q["sql"]]
    assert len(reads) == 1 and "agents_apitoken" in reads[0]
    access.forget_roles(both)
    assert (groups, roles) == access._roles_of(both) and groups == {"launcher", "reviewer"}
    assert roles["reviewer"] == roles["operator"] == {finance.pk} and roles["launcher"] == set()
    # No role at all: the outer join's row of NULLs is no role.
    nobody = token_user(token_create(user=User.objects.create_user("nobody"))[1])
    assert access._roles_of(nobody) == (set(), {role: set() for role in access.ROLES})
