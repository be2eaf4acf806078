"""A token's request to /api/ goes through `config.wsgi` (and `config.asgi`) to Django
without a browser's middleware (agents/ops/doors.py), and answers exactly as through
the whole stack: the same statuses, bodies and security headers, the same token scope,
the same refusal log line; the host check and CSRF for a session's request stay."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import logging
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from agents.actions.tokens import token_create
from agents.models import Project, Run
from agents.ops import doors
from config import wsgi
from tests.helpers import requires_postgres, wsgi_call

# A WSGI handler opens and closes its request's connection (request_started and
# request_finished): the rows must be committed to be seen, as in tests/gateway/test_wsgi_door.py.
pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]

# Headers the site sets on every answer; a token's answer must carry the same ones.
SECURITY_HEADERS = ("x-content-type-options", "x-frame-options", "referrer-policy", "cross-origin-opener-policy",
                    "content-security-policy", "content-type")


def call(app: Any, method: str, path: str, *, token: str | None = None, body: Any = None,
         **headers: str) -> tuple[int, dict[str, str], bytes]:
    raw = b"" if body is None else json.dumps(body).encode()
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "HTTP_HOST": "testserver", "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)), "wsgi.input": io.BytesIO(raw), **headers,
    }
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return wsgi_call(app, environ)


@pytest.fixture
def lenas_run(lena: User) -> Run:
    from agents.actions.runs import run_launch

    return run_launch(agent="scripted", task="door test", user=lena, script=[{"final": "done"}])


def test_the_token_door_leaves_out_only_a_browsers_middleware() -> None:
    kept = [m for m in settings.MIDDLEWARE if m not in settings.BROWSER_ONLY_MIDDLEWARE]
    assert settings.TOKEN_API_MIDDLEWARE == kept
    for needed in ("agents.ops.middleware.DenialLogMiddleware", "agents.ops.unavailable.DatabaseUnavailableMiddleware",
                   "django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware",
                   "agents.ops.policy_header.CSPMiddleware", "django.middleware.clickjacking.XFrameOptionsMiddleware"):
        assert needed in settings.TOKEN_API_MIDDLEWARE
    assert "django.contrib.sessions.middleware.SessionMiddleware" not in settings.TOKEN_API_MIDDLEWARE


def test_only_a_request_with_an_authorization_header_to_the_api_takes_it() -> None:
    assert doors.is_token_request("/api/runs/1", "Bearer x")
    assert doors.is_token_request("/api/runs/1", "Basic eDp5")  # refused there, 401: never a session
    assert not doors.is_token_request("/api/runs/1", None)
    assert not doors.is_token_request("/runs/1/", "Bearer x")


def test_a_tokens_read_answers_as_through_the_whole_stack(lena: User, lenas_run: Run, monkeypatch) -> None:
    _row, raw = token_create(user=lena)
    taken: list[str] = []
    door = wsgi.token_api_application
    monkeypatch.setattr(wsgi, "token_api_application", lambda e, s: (taken.append(e["PATH_INFO"]), door(e, s))[1])
    fast = call(wsgi.application, "GET", f"/api/runs/{lenas_run.pk}", token=raw)
    full = call(wsgi.django_application, "GET", f"/api/runs/{lenas_run.pk}", token=raw)
    assert taken == [f"/api/runs/{lenas_run.pk}"]
    assert fast[0] == full[0] == 200
    assert json.loads(fast[2]) == json.loads(full[2])
    for name in SECURITY_HEADERS:
        assert fast[1].get(name) == full[1].get(name), name
    assert "set-cookie" not in fast[1]  # no session, no CSRF cookie


def test_the_decision_apis_calls_answer_through_it(defaults: None, lena: User) -> None:
    from agents.models import AgentProfile
    from bench.gateway import NOTE_TOOL

    AgentProfile.objects.create(name="ext", provider="external", tools=[], client_tools=[NOTE_TOOL])
    _row, raw = token_create(user=lena)
    status, _h, content = call(wsgi.application, "POST", "/api/runs", token=raw, body={"agent": "ext", "task": "t"})
    assert status == 201, content
    run_id = json.loads(content)["id"]
    status, _h, content = call(wsgi.application, "POST", f"/api/runs/{run_id}/calls", token=raw,
                               body={"tool": "note", "args": {"text": "hi"}})
    assert status == 200 and json.loads(content)["status"] == "approved", content
    key = json.loads(content)["key"]
    status, _h, content = call(wsgi.application, "POST", f"/api/runs/{run_id}/calls/{key}/result", token=raw,
                               body={"ok": True, "output": "noted"})
    assert status == 200 and json.loads(content)["status"] == "succeeded", content


@pytest.mark.parametrize("door", ["token door", "whole stack"])
def test_an_unknown_token_is_refused_and_logged_the_same(door: str, lenas_run: Run, caplog) -> None:
    app = wsgi.application if door == "token door" else wsgi.django_application
    with caplog.at_level(logging.WARNING, logger="airlock.access"):
        status, _h, content = call(app, "GET", f"/api/runs/{lenas_run.pk}", token="not-a-token")
    assert status == 401
    assert b"not-a-token" not in content
    lines = [r.getMessage() for r in caplog.records if r.name == "airlock.access"]
    assert lines == [f"denied status=401 method=GET path=/api/runs/{lenas_run.pk} user=anonymous"]


@pytest.mark.parametrize("door", ["token door", "whole stack"])
def test_a_tokens_scope_holds_through_it(door: str, leo: User, lena: User, lenas_run: Run, teams, caplog) -> None:
    app = wsgi.application if door == "token door" else wsgi.django_application
    _row, leos = token_create(user=leo)
    # lena's token limited to a project her run is not in
    _row, scoped = token_create(user=lena, project=Project.objects.get(slug="support"))
    with caplog.at_level(logging.WARNING, logger="airlock.access"):
        other = call(app, "GET", f"/api/runs/{lenas_run.pk}", token=leos)
        narrowed = call(app, "GET", f"/api/runs/{lenas_run.pk}", token=scoped)
    assert other[0] in (403, 404) and narrowed[0] in (403, 404)
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name == "airlock.access"] == [
        f"denied status={other[0]} method=GET path=/api/runs/{lenas_run.pk} user=leo",
        f"denied status={narrowed[0]} method=GET path=/api/runs/{lenas_run.pk} user=lena",
    ]


def test_the_host_check_still_refuses_a_stranger(lena: User, lenas_run: Run) -> None:
    _row, raw = token_create(user=lena)
    status, _h, _c = call(wsgi.application, "GET", f"/api/runs/{lenas_run.pk}", token=raw, HTTP_HOST="evil.example")
    assert status == 400


def test_a_sessions_post_without_a_token_still_needs_csrf(lena: User, client) -> None:
    client.force_login(lena)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    status, _h, content = call(wsgi.application, "POST", "/api/runs", body={"agent": "scripted", "task": "t"},
                               HTTP_COOKIE=f"{settings.SESSION_COOKIE_NAME}={cookie}")
    assert status == 403 and b"CSRF" in content


def test_the_apis_patterns_are_tried_first_and_pages_still_resolve() -> None:
    from django.urls import get_resolver, resolve

    assert str(get_resolver().url_patterns[0].pattern) == "api/"
    assert resolve("/api/runs/1").namespace == "api"
    assert resolve("/runs/").namespace != "api"  # the pages resolve as before
    assert resolve("/").url_name == "overview"


def test_the_asgi_door_takes_a_tokens_request_too(lena: User, lenas_run: Run, monkeypatch) -> None:
    from asgiref.sync import async_to_sync

    from config import asgi

    _row, raw = token_create(user=lena)
    taken: list[str] = []
    door = asgi.token_api_application

    async def spy(scope: Any, receive: Any, send: Any) -> None:
        taken.append(scope["path"])
        await door(scope, receive, send)

    monkeypatch.setattr(asgi, "token_api_application", spy)
    sent: list[dict[str, Any]] = []
    bodies = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await asyncio.sleep(60)  # no disconnect: Django stops listening once it has answered
        return {"type": "http.disconnect"}

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    path = f"/api/runs/{lenas_run.pk}"
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {raw}".encode())],
             "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1), "http_version": "1.1",
             "asgi": {"version": "3.0"}, "root_path": ""}
    # In a thread of its own: a browser test's Playwright may keep an event loop running
    # in the test thread, where async_to_sync refuses to run.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(async_to_sync(asgi.application), scope, receive, send).result()
    assert taken == [path]
    assert sent[0]["status"] == 200
    assert json.loads(b"".join(e.get("body", b"") for e in sent[1:]))["id"] == lenas_run.pk
