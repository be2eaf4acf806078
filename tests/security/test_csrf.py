"""A logged-in browser session that POSTs without the CSRF token is refused and records
nothing, on every page endpoint that takes a POST and on the API's session login."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import ApiToken
from tests.helpers import counts

pytestmark = [pytest.mark.reliability, pytest.mark.django_db]

# Every URL that changes something through a session POST: (path, form data or JSON).
# Each form, and what it answers once the token is there: the token, not the route,
# refused it. The outcome-unknown decisions answer 400 here because the pending call
# is an ordinary one, not an "outcome unknown" one.
POSTS = [
    ("/runs/new/", {"agent": "scripted", "task": "say hi", "approver": "human", "script": '[{"final": "hi"}]'}, 302),
    ("/runs/{run}/cancel/", {"reason": "forged"}, 302),
    ("/reviews/{a}/approve/", {"note": ""}, 303),
    ("/reviews/{a}/reject/", {"note": "forged"}, 303),
    ("/reviews/{a}/happened/", {"note": ""}, 400),
    ("/reviews/{a}/retry/", {"note": ""}, 400),
    ("/reviews/{a}/fail/", {"note": ""}, 400),
    ("/admin/agents/apitoken/", {"action": "revoke", "_selected_action": ["{token}"], "index": "0"}, 302),
    ("/admin/auth/user/add/", {"username": "mallory", "password1": "x9!kq2Lw#p", "password2": "x9!kq2Lw#p"}, 302),
    ("/logout/", {}, 302),
]
API_POSTS = [
    ("/api/runs", {"agent": "scripted", "task": "say hi", "script": [{"final": "hi"}]}, 201),
    ("/api/runs/{run}/cancel", None, 200),
    ("/api/approvals/{a}/decision", {"decision": "approve", "note": ""}, 200),
]


def snapshot() -> dict[str, int]:
    from django.contrib.auth.models import User

    return {
        **counts(),
        "revoked_tokens": ApiToken.objects.filter(revoked_at__isnull=False).count(),
        "users": User.objects.count(),
    }


@pytest.fixture
def target(people, pending) -> dict[str, int]:
    approval = pending(user=people["other"])
    token, _raw = token_create(user=people["other"])
    return {"run": approval.run_id, "a": approval.pk, "token": token.pk}


def superuser_session(people) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["superuser"])
    client.get("/")  # the pages hand out the csrftoken cookie; the forger cannot read it
    return client


@pytest.mark.parametrize("path, data, answer", POSTS, ids=[p for p, _, _ in POSTS])
def test_a_session_post_without_the_csrf_token_is_refused_and_records_nothing(
    path, data, answer, people, target, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="airlock.access")
    client = superuser_session(people)
    url = path.format(**target)
    form = {k: ([x.format(**target) for x in v] if isinstance(v, list) else v) for k, v in data.items()}
    before = snapshot()
    response = client.post(url, form)
    assert response.status_code == 403
    assert snapshot() == before
    assert f"denied status=403 method=POST path={url} user=root" in caplog.text
    # The same request with the token goes through: the token, not the route, refused it.
    with_token = client.post(url, form, headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert with_token.status_code == answer, with_token.status_code


@pytest.mark.parametrize("path, body, answer", API_POSTS, ids=[p for p, _, _ in API_POSTS])
def test_an_api_post_on_the_session_without_the_csrf_token_is_refused(path, body, answer, people, target) -> None:
    client = superuser_session(people)
    url = path.format(**target)
    before = snapshot()
    response = client.post(url, json.dumps(body) if body is not None else "", content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert snapshot() == before
    ok = client.post(
        url,
        json.dumps(body) if body is not None else "",
        content_type="application/json",
        headers={"X-CSRFToken": client.cookies["csrftoken"].value},
    )
    assert ok.status_code == answer, ok.content


def test_the_login_form_refuses_a_post_without_the_csrf_token(people) -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"username": "root", "password": "correct horse battery"})
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session
