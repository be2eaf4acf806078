"""A strict Content-Security-Policy on every page, and pages that need nothing looser.

Every response a superuser can reach carries the policy: scripts and styles only from
our origin (no 'unsafe-inline', no 'unsafe-eval'), no plugins, no framing, no <base>.
The HTML has no inline script, style attribute or on* handler, and htmx is told not to
eval, not to inject its indicator styles and to talk to our origin only. In Chromium the
same pages raise no CSP violation (the e2e page fixture fails on any).
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client

from agents.actions.tokens import token_create

pytestmark = [pytest.mark.reliability]


def pages(ids: dict[str, int]) -> list[str]:
    return [
        "/",
        "/runs/",
        "/runs/?state=awaiting_approval&tainted=yes&q=x",
        "/runs/new/",
        f"/runs/{ids['run']}/",
        f"/runs/{ids['run']}/?live=1&after=0",
        f"/runs/{ids['run']}/export/",
        "/reviews/",
        "/reviews/list/",
        "/reviews/badge/",
        f"/reviews/{ids['approval']}/",
        "/api/docs",
        "/api/openapi.json",
        f"/api/runs/{ids['run']}",
        "/admin/",
        "/admin/agents/apitoken/",
        f"/admin/agents/apitoken/{ids['token']}/change/",
        "/admin/auth/user/",
        f"/admin/auth/user/{ids['user']}/change/",
        "/admin/auth/group/",
        "/admin/password_change/",
        "/demo-site/",
        "/no-such-page/",
    ]


def policy(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            out[words[0]] = words[1:]
    return out


def assert_strict(header: str, url: str) -> None:
    assert header, f"{url}: no Content-Security-Policy header"
    assert "unsafe-" not in header, (url, header)  # unsafe-inline, unsafe-eval, unsafe-hashes
    p = policy(header)
    assert p["default-src"] == ["'self'"], (url, header)
    assert p["script-src"] == ["'self'"], (url, header)
    assert p["style-src"] == ["'self'"], (url, header)
    assert p["object-src"] == ["'none'"] and p["base-uri"] == ["'none'"], (url, header)
    assert p["frame-ancestors"] == ["'none'"] and p["form-action"] == ["'self'"], (url, header)
    assert "*" not in " ".join(v for vals in p.values() for v in vals), (url, header)


class Inline(HTMLParser):
    """Collects what a strict policy would block: inline scripts, style attributes, on*."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.htmx_config: Any = None
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        # A JSON data block (the API docs' settings) is not code: the browser never runs it.
        if tag == "script" and not a.get("src") and a.get("type") != "application/json":
            self._in_script = True
        if tag == "style":
            self.found.append("<style> element")
        for name, _value in attrs:
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name == "href" and (_value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} href=javascript:>")
        if tag == "meta" and a.get("name") == "htmx-config":
            self.htmx_config = json.loads(a.get("content") or "{}")

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.found.append(f"inline script: {data.strip()[:60]}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False


@pytest.fixture
def ids(people, pending) -> dict[str, int]:
    approval = pending(user=people["other"])
    token, _raw = token_create(user=people["other"])
    return {"run": approval.run_id, "approval": approval.pk, "token": token.pk, "user": people["other"].pk}


@pytest.mark.django_db
def test_every_page_carries_the_strict_policy_and_no_inline_code(people, ids) -> None:
    client = Client()
    client.force_login(people["superuser"])
    urls = pages(ids)
    for url in urls:
        response = client.get(url)
        assert response.status_code == (404 if url == "/no-such-page/" else 200), (url, response.status_code)
        assert_strict(response.get("Content-Security-Policy", ""), url)
        if not response["Content-Type"].startswith("text/html"):
            continue
        html = response.content.decode()
        parser = Inline()
        parser.feed(html)
        assert parser.found == [], (url, parser.found)
        if "htmx" in html and not url.startswith(("/admin/", "/api/")):
            # Every page that loads htmx extends base.html, which configures it for the policy.
            config = parser.htmx_config
            assert config is not None, url
            assert config["includeIndicatorStyles"] is False and config["allowEval"] is False, url
            assert config["selfRequestsOnly"] is True and config["allowScriptTags"] is False, url
    # The anonymous pages too: the login form and the refusals.
    anonymous = Client()
    for url in ["/login/", "/", "/api/openapi.json", "/api/runs/1", "/admin/login/"]:
        response = anonymous.get(url)
        assert_strict(response.get("Content-Security-Policy", ""), url)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_chromium_sees_no_csp_violation_on_any_page(new_page, login, people, ids) -> None:
    from tests.helpers import PASSWORD as PW

    page, watch = new_page()
    login(page, "root", PW)
    for url in pages(ids):
        if url.endswith(("/export/", ".json")) or url.startswith("/api/runs/"):
            continue  # downloads and JSON, not documents
        page.goto(url)
        page.wait_for_load_state("networkidle")
    page.goto("/api/docs")
    page.get_by_text("Launch a run").first.wait_for()
    # The new_page fixture fails the test on any CSP violation, dialog or foreign request;
    # checked here as well so a failure names the page.
    assert watch.csp_violations == [] and watch.foreign_requests == []
