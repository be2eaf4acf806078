"""Who may do what, for every page and API endpoint and the methods that matter.

The expected status of every (request, role) pair is written out below by hand from the
design (groups: reviewer decides, operator cancels, launcher launches and reads its own
runs, superuser all; login everywhere), not computed from the code. A denied request
changes nothing and leaves a log line naming the user, the method and the path.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.crypto import get_random_string

from agents.actions.tokens import token_create
from agents.models import ApiToken
from tests.helpers import ROLES, USERNAMES, counts

pytestmark = [pytest.mark.reliability, pytest.mark.django_db]

SCRIPT = json.dumps([{"final": "hi"}])
LAUNCH_FORM = {"agent": "scripted", "task": "say hi", "approver": "human", "script": SCRIPT}
LAUNCH_JSON = {"agent": "scripted", "task": "say hi", "script": [{"final": "hi"}]}

# {other}: a run launched by leo (another launcher) waiting for a reviewer, {a} its
# approval; {own}: a run launched by lena (the launcher persona); {token}: an API token.
# 302 to a login page is how pages refuse an anonymous visitor (the admin refuses
# non-staff the same way); a launcher asking for someone else's run gets 404 from pages
# and API alike (agents.access.readable_run), so run ids leak nothing; otherwise the API
# says 401/403 in JSON.
# fmt: off
#            name                           method    path                                anon launcher operator reviewer superuser
PAGES = [
    ("overview",                            "GET",    "/",                                (302, 200, 200, 200, 200)),
    ("overview, wrong method",              "POST",   "/",                                (405, 405, 405, 405, 405)),
    ("run list",                            "GET",    "/runs/",                           (302, 200, 200, 200, 200)),
    ("run list, wrong method",              "DELETE", "/runs/",                           (405, 405, 405, 405, 405)),
    ("launch form",                         "GET",    "/runs/new/",                       (302, 200, 403, 403, 200)),
    ("launch",                              "POST",   "/runs/new/",                       (302, 302, 403, 403, 302)),
    ("launch, wrong method",                "PUT",    "/runs/new/",                       (405, 405, 405, 405, 405)),
    ("own run timeline",                    "GET",    "/runs/{own}/",                     (302, 200, 200, 200, 200)),
    ("other's run timeline",                "GET",    "/runs/{other}/",                   (302, 404, 200, 200, 200)),
    ("other's run live poll",               "GET",    "/runs/{other}/?live=1&after=0",    (302, 404, 200, 200, 200)),
    ("timeline, wrong method",              "POST",   "/runs/{other}/",                   (405, 405, 405, 405, 405)),
    ("own run export",                      "GET",    "/runs/{own}/export/",              (302, 200, 200, 200, 200)),
    ("other's run export",                  "GET",    "/runs/{other}/export/",            (302, 404, 200, 200, 200)),
    ("export, wrong method",                "POST",   "/runs/{other}/export/",            (405, 405, 405, 405, 405)),
    ("cancel other's run",                  "POST",   "/runs/{other}/cancel/",            (302, 404, 302, 403, 302)),
    ("cancel own run",                      "POST",   "/runs/{own}/cancel/",              (302, 403, 302, 403, 302)),
    ("cancel, wrong method",                "GET",    "/runs/{other}/cancel/",            (405, 405, 405, 405, 405)),
    ("save other's run as eval case",       "POST",   "/runs/{other}/eval-case/",         (302, 404, 302, 403, 302)),
    ("save own run as eval case",           "POST",   "/runs/{own}/eval-case/",           (302, 403, 302, 403, 302)),
    ("save eval case, wrong method",        "GET",    "/runs/{other}/eval-case/",         (405, 405, 405, 405, 405)),
    ("review queue",                        "GET",    "/reviews/",                        (302, 200, 200, 200, 200)),
    ("review queue, wrong method",          "POST",   "/reviews/",                        (302, 405, 405, 405, 405)),
    ("review list poll",                    "GET",    "/reviews/list/",                   (302, 200, 200, 200, 200)),
    ("review badge",                        "GET",    "/reviews/badge/",                  (302, 200, 200, 200, 200)),
    ("review stats",                        "GET",    "/reviews/stats/",                  (302, 403, 200, 200, 200)),
    ("review stats, wrong method",          "POST",   "/reviews/stats/",                  (302, 405, 405, 405, 405)),
    ("other's approval page",               "GET",    "/reviews/{a}/",                    (302, 404, 200, 200, 200)),
    ("approval page, wrong method",         "POST",   "/reviews/{a}/",                    (302, 405, 405, 405, 405)),
    ("approve",                             "POST",   "/reviews/{a}/approve/",            (302, 403, 403, 303, 303)),
    ("reject",                              "POST",   "/reviews/{a}/reject/",             (302, 403, 403, 303, 303)),
    ("happened on a policy approval",       "POST",   "/reviews/{a}/happened/",           (302, 403, 403, 400, 400)),
    ("retry on a policy approval",          "POST",   "/reviews/{a}/retry/",              (302, 403, 403, 400, 400)),
    ("fail on a policy approval",           "POST",   "/reviews/{a}/fail/",               (302, 403, 403, 400, 400)),
    ("approve, wrong method",               "GET",    "/reviews/{a}/approve/",            (302, 405, 405, 405, 405)),
    ("admin index",                         "GET",    "/admin/",                          (302, 302, 302, 302, 200)),
    ("admin tokens",                        "GET",    "/admin/agents/apitoken/",          (302, 302, 302, 302, 200)),
    ("admin token page",                    "GET",    "/admin/agents/apitoken/{token}/change/", (302, 302, 302, 302, 200)),
    ("admin users",                         "GET",    "/admin/auth/user/",                (302, 302, 302, 302, 200)),
    ("admin revoke tokens",                 "POST",   "/admin/agents/apitoken/",          (302, 302, 302, 302, 302)),
    ("admin webhooks",                      "GET",    "/admin/agents/webhook/",           (302, 302, 302, 302, 200)),
    ("admin deliveries",                    "GET",    "/admin/agents/delivery/",          (302, 302, 302, 302, 200)),
    ("admin new token",                     "GET",    "/admin/agents/apitoken/add/",      (302, 302, 302, 302, 200)),
    ("admin new webhook",                   "GET",    "/admin/agents/webhook/add/",       (302, 302, 302, 302, 200)),
    ("admin mcp tools",                     "GET",    "/admin/agents/mcptool/",           (302, 302, 302, 302, 200)),
    ("notification preference",             "GET",    "/account/notifications/",          (302, 200, 200, 200, 200)),
    ("notification preference, save",       "POST",   "/account/notifications/",          (302, 302, 302, 302, 302)),
    ("notification preference, wrong method", "PUT",  "/account/notifications/",          (405, 405, 405, 405, 405)),
    ("demo site",                           "GET",    "/demo-site/",                      (302, 200, 200, 200, 200)),
    ("demo site, wrong method",             "POST",   "/demo-site/",                      (405, 405, 405, 405, 405)),
    ("API docs",                            "GET",    "/api/docs",                        (302, 200, 200, 200, 200)),
    ("OpenAPI schema",                      "GET",    "/api/openapi.json",                (401, 200, 200, 200, 200)),
    # The only paths without a login: probes, and metrics behind their own bearer token
    # (tests/operations); unset, as here, /metrics does not exist for anyone.
    ("health",                              "GET",    "/healthz",                         (200, 200, 200, 200, 200)),
    ("readiness",                           "GET",    "/readyz",                          (200, 200, 200, 200, 200)),
    ("metrics, no token configured",        "GET",    "/metrics",                         (404, 404, 404, 404, 404)),
    ("health, wrong method",                "POST",   "/healthz",                         (405, 405, 405, 405, 405)),
]

# The JSON API with `Authorization: Bearer` (anonymous: no header).
API = [
    ("launch",                              "POST",   "/api/runs",                        (401, 201, 403, 403, 201)),
    ("launch, wrong method",                "PUT",    "/api/runs",                        (405, 405, 405, 405, 405)),
    ("runs",                                "GET",    "/api/runs",                        (401, 200, 200, 200, 200)),
    ("other's runs",                        "GET",    "/api/runs?launched_by=leo",        (401, 200, 200, 200, 200)),
    ("own run",                             "GET",    "/api/runs/{own}",                  (401, 200, 200, 200, 200)),
    ("other's run",                         "GET",    "/api/runs/{other}",                (401, 404, 200, 200, 200)),
    ("run, wrong method",                   "DELETE", "/api/runs/{other}",                (405, 405, 405, 405, 405)),
    ("run, wrong method (PATCH)",           "PATCH",  "/api/runs/{other}",                (405, 405, 405, 405, 405)),
    ("own run's transitions",               "GET",    "/api/runs/{own}/transitions",      (401, 200, 200, 200, 200)),
    ("other's run's transitions",           "GET",    "/api/runs/{other}/transitions",    (401, 404, 200, 200, 200)),
    ("cancel other's run",                  "POST",   "/api/runs/{other}/cancel",         (401, 403, 200, 403, 200)),
    ("cancel own run",                      "POST",   "/api/runs/{own}/cancel",           (401, 403, 200, 403, 200)),
    ("cancel, wrong method",                "GET",    "/api/runs/{other}/cancel",         (405, 405, 405, 405, 405)),
    ("approvals",                           "GET",    "/api/approvals",                   (401, 200, 200, 200, 200)),
    ("pending approvals",                   "GET",    "/api/approvals?status=pending",    (401, 200, 200, 200, 200)),
    ("approvals, wrong method",             "POST",   "/api/approvals",                   (405, 405, 405, 405, 405)),
    ("decide",                              "POST",   "/api/approvals/{a}/decision",      (401, 403, 403, 200, 200)),
    ("decide, wrong method",                "PUT",    "/api/approvals/{a}/decision",      (405, 405, 405, 405, 405)),
    ("no such endpoint",                    "GET",    "/api/nowhere",                     (404, 404, 404, 404, 404)),
]
# fmt: on


@pytest.fixture(autouse=True)
def evals_dir(settings: Any, tmp_path: Any) -> None:
    """"Save as eval case" writes into a folder of the test's own, not the repository's evals/."""
    settings.AIRLOCK_EVALS_DIR = tmp_path / "evals"


def body_for(method: str, path: str, ids: dict[str, Any]) -> tuple[Any, str]:
    """The request body a real client would send, and its content type."""
    if path == "/runs/new/":
        return LAUNCH_FORM, "form"
    if path == "/admin/agents/apitoken/" and method == "POST":
        return {"action": "revoke", "_selected_action": [str(ids["token"])], "index": "0"}, "form"
    if path.startswith("/runs/") and path.endswith("/cancel/"):
        return {"reason": "matrix"}, "form"
    if path.startswith("/reviews/"):
        return {"note": "matrix"}, "form"
    if path == "/api/runs":
        return LAUNCH_JSON, "json"
    if path.endswith("/decision"):
        return {"decision": "approve", "note": "matrix"}, "json"
    return None, "none"


def page_client(user: User | None) -> Client:
    """A browser-like client: CSRF enforced, and the token sent as the pages send it."""
    client = Client(enforce_csrf_checks=True)
    if user is not None:
        client.force_login(user)
    secret = get_random_string(32)
    client.cookies["csrftoken"] = secret
    client.defaults["HTTP_X_CSRFTOKEN"] = secret
    return client


def send(client: Client, method: str, path: str, body: Any, kind: str, headers: dict[str, str]) -> Any:
    if kind == "json":
        return client.generic(method, path, json.dumps(body), content_type="application/json", headers=headers)
    if kind == "form" and method == "POST":
        return client.post(path, body, headers=headers)
    return client.generic(method, path, headers=headers)


def all_counts() -> dict[str, int]:
    return {**counts(), "revoked_tokens": ApiToken.objects.filter(revoked_at__isnull=False).count()}


def is_denial(status: int, response: Any, role: str, path: str) -> bool:
    if status in (401, 403):
        return True
    if status == 302 and response["Location"].split("?")[0] in ("/login/", "/admin/login/"):
        return True
    return status == 404 and role == "launcher" and ("{other}" in path or "{a}" in path)


def check(
    rows: list[tuple[str, str, str, tuple[int, ...]]], row: tuple[Any, ...], api: bool, people, pending, caplog
) -> None:
    name, method, template, expected = row
    caplog.set_level(logging.WARNING, logger="airlock.access")
    seen = {}
    other = own = None
    for role in ROLES:
        user = people.get(role)
        # Fresh objects for each role after a change, so it does not alter the next one.
        if other is None or method not in ("GET", "HEAD"):
            other = pending(user=people["other"])
            own = pending(user=people["launcher"])
        token = ApiToken.objects.filter(user=people["other"]).first() or _token(people["other"])[0]
        ids = {"other": other.run_id, "own": own.run_id, "a": other.pk, "token": token.pk}
        path = template.format(**ids)
        body, kind = body_for(method, template, ids)
        if api:
            client = Client(enforce_csrf_checks=True)
            headers = {"Authorization": f"Bearer {_token(user)[1]}"} if user is not None else {}
        else:
            client = page_client(user)
            headers = {}
        before = all_counts()
        caplog.clear()
        response = send(client, method, path, body, kind, headers)
        status = response.status_code
        seen[role] = status
        if api:
            assert response["Content-Type"].startswith("application/json"), (role, name, response.content[:200])
        ok = status < 400 and not is_denial(status, response, role, template)
        if not ok:
            assert all_counts() == before, (role, name, status)
        if is_denial(status, response, role, template):
            who = USERNAMES.get(role, "anonymous")
            line = f"denied status={status} method={method} path={path.split('?')[0]} user={who}"
            assert line in caplog.text, (role, name, caplog.text)
            assert "Bearer" not in caplog.text and "airlock_" not in caplog.text
    assert tuple(seen[r] for r in ROLES) == expected, f"{name}: {seen}"


def _token(user: User | None) -> tuple[ApiToken, str]:
    return token_create(user=user)


@pytest.mark.parametrize("row", PAGES, ids=[f"{m} {p}" for _, m, p, _ in PAGES])
def test_pages_answer_each_role_as_the_table_says(row, people, pending, caplog) -> None:
    check(PAGES, row, False, people, pending, caplog)


@pytest.mark.parametrize("row", API, ids=[f"{m} {p}" for _, m, p, _ in API])
def test_api_answers_each_role_as_the_table_says(row, people, pending, caplog) -> None:
    check(API, row, True, people, pending, caplog)


def test_a_launcher_sees_nothing_of_another_launchers_run(people, pending) -> None:
    """Beyond status codes: the other run's task and arguments appear on no page or answer."""
    secret = "LEO-ONLY-" + get_random_string(12)
    theirs = pending(user=people["other"], task=f"task {secret}", script=None)
    Approval = type(theirs)
    Approval.objects.filter(pk=theirs.pk).update(args={"entry": secret})
    mine = pending(user=people["launcher"])
    client = page_client(people["launcher"])
    api = Client(headers={"Authorization": f"Bearer {_token(people['launcher'])[1]}"})
    shown = [
        client.get(url).content.decode()
        for url in ["/", "/runs/", f"/runs/?q={secret}", "/reviews/", "/reviews/list/", "/reviews/badge/"]
    ]
    shown += [api.get(url).content.decode() for url in ["/api/approvals", "/api/approvals?status=pending"]]
    # (the search page repeats the launcher's own query in its search box: remove that)
    shown[2] = shown[2].replace(f'value="{secret}"', "")
    assert [i for i, text in enumerate(shown) if secret in text] == []
    assert f"/runs/{theirs.run_id}/" not in "".join(shown)
    assert f"/runs/{mine.run_id}/" in shown[1]  # while the launcher's own run is listed
    assert [a["id"] for a in api.get("/api/approvals").json()["items"]] == [mine.pk]
