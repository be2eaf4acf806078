"""A canary API key appears nowhere: not in pages, error pages, the admin, exports, the
API, the logs (DEBUG level, in-process and a real worker's output) or the database.

tests/llm/test_secrets.py covers the OpenAI client's own errors against rows and logs;
here both providers' keys are canaries and every output the product has is searched.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import socket
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import AgentProfile, Run
from tests.helpers import requires_postgres, wait_for
from tests.llm.provider import Reply
from tests.llm.shapes import anthropic_error, openai_error
from tests.workers.cluster import Cluster

pytestmark = [pytest.mark.reliability]


def canaries(monkeypatch: Any, provider: Any) -> tuple[str, str]:
    openai_key = f"sk-canary-{secrets.token_hex(12)}"
    anthropic_key = f"sk-ant-canary-{secrets.token_hex(12)}"
    monkeypatch.setenv("OPENAI_API_KEY", openai_key)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_key)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", provider.url)
    return openai_key, anthropic_key


def echoing_errors(provider: Any, openai_key: str, anthropic_key: str) -> None:
    """Replies that repeat the key back, as a misbehaving proxy might, in each shape."""
    provider.add(
        Reply(401, openai_error(f"Incorrect API key provided: {openai_key}.", code="invalid_api_key")),
        Reply(500, f"upstream said: bad key {openai_key}"),
        Reply(200, f"<html>{openai_key}</html>"),
        Reply(401, anthropic_error("authentication_error", f"invalid x-api-key: {anthropic_key}")),
        Reply(529, anthropic_error("overloaded_error", f"overloaded (key {anthropic_key})")),
        Reply(200, {"error": {"message": anthropic_key}}),
    )


def profiles() -> None:
    AgentProfile.objects.create(name="gpt", provider="openai", model_name="gpt-4o-mini", tools=["kb_search"])
    AgentProfile.objects.create(name="claude", provider="anthropic", model_name="claude-sonnet-4", tools=["kb_search"])


@pytest.mark.django_db(transaction=True)
def test_canary_keys_appear_in_no_page_error_page_export_api_answer_log_or_row(
    defaults, people, provider, monkeypatch, settings, drive, caplog
) -> None:
    openai_key, anthropic_key = canaries(monkeypatch, provider)
    settings.DEBUG = False
    settings.AIRLOCK_LLM_BACKOFF = 0.0
    settings.AIRLOCK_LLM_RETRIES = 0
    settings.ROOT_URLCONF = "tests.security.urls_boom"
    caplog.set_level(logging.DEBUG)
    profiles()
    echoing_errors(provider, openai_key, anthropic_key)

    # Launched through the API, driven as a worker would.
    _row, raw = token_create(user=people["superuser"])
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    ids = []
    for agent in ["gpt"] * 3 + ["claude"] * 3:
        r = api.post(
            "/api/runs", {"agent": agent, "task": "what is our refund policy?"}, content_type="application/json"
        )
        assert r.status_code == 201, r.content
        ids.append(r.json()["id"])
    runs = [drive(Run.objects.get(pk=i)) for i in ids]
    assert [r.state for r in runs] == ["failed"] * 6, [(r.state, r.error) for r in runs]
    # The keys really went out, so finding them nowhere means something.
    assert provider.requests[0].headers["authorization"] == f"Bearer {openai_key}"
    assert provider.requests[3].headers["x-api-key"] == anthropic_key

    outputs: list[str] = []
    browser = Client(raise_request_exception=False)
    browser.force_login(people["superuser"])
    urls = ["/", "/runs/", "/reviews/", "/api/docs", "/admin/", "/admin/agents/apitoken/", "/admin/auth/user/"]
    urls += [f"/admin/auth/user/{people['superuser'].pk}/change/", f"/admin/agents/apitoken/{_row.pk}/change/"]
    for i in ids:
        urls += [f"/runs/{i}/", f"/runs/{i}/export/", f"/api/runs/{i}", f"/api/runs/{i}/transitions"]
    urls += ["/api/approvals", "/api/openapi.json"]
    for url in urls:
        response = browser.get(url)
        assert response.status_code == 200, (url, response.status_code)
        outputs.append(response.content.decode())
    # Error pages with DEBUG off: a 404, a 500 (whose frame holds the key), API errors.
    missing = browser.get("/runs/999999/")
    crashed = browser.get("/boom/")
    assert (missing.status_code, crashed.status_code) == (404, 500)
    assert "the provider client crashed" in caplog.text  # the 500 was logged, traceback and all
    outputs += [missing.content.decode(), crashed.content.decode()]
    outputs.append(api.get("/api/runs/999999").content.decode())
    outputs.append(api.post("/api/runs", "{not json", content_type="application/json").content.decode())
    # The export command and a dump of the whole database.
    for i in ids:
        out = io.StringIO()
        call_command("export_run", str(i), stdout=out)
        outputs.append(out.getvalue())
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    outputs.append(dump.getvalue())
    assert "authentication failed" in json.dumps(outputs)  # the errors are there, redacted
    outputs.append(caplog.text)

    everything = "\n".join(outputs)
    for key in (openai_key, anthropic_key):
        assert key not in everything
        assert key[-12:] not in everything  # not even its tail
    assert "[redacted]" in everything


@requires_postgres()
@pytest.mark.worker
def test_a_real_worker_logs_no_canary_key_at_debug_level(
    cluster: Cluster, people, provider, monkeypatch, launch
) -> None:
    openai_key, anthropic_key = canaries(monkeypatch, provider)
    profiles()
    echoing_errors(provider, openai_key, anthropic_key)
    import os

    cluster.start_worker(
        "w1",
        LOG_LEVEL="DEBUG",
        AIRLOCK_LLM_RETRIES="0",
        AIRLOCK_LLM_BACKOFF="0",
        **{k: os.environ[k] for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")},
    )
    ids = [launch(None, agent=agent, task="what is our refund policy?").pk for agent in ["gpt"] * 3 + ["claude"] * 3]
    wait_for(lambda: Run.objects.filter(pk__in=ids, state="failed").count() == 6, timeout=120, what="six runs failed")
    assert len(provider.requests) == 6
    log = cluster.log("w1")
    assert "committed run=" in log and "DEBUG" in log  # the worker really logged, at DEBUG
    assert openai_key not in log and anthropic_key not in log


@pytest.mark.django_db
def test_webhook_urls_and_secrets_appear_in_no_log_line(receiver, settings, monkeypatch, launch, drive, caplog) -> None:
    """Issue 34, item 6: httpx logged every request URL at INFO, so a Slack webhook URL
    (a credential the admin hides), every webhook path and every http_get URL reached
    the worker's log. Delivered, failed and fetched, at DEBUG: none of them is logged."""
    from agents.models import Delivery, Webhook
    from agents.notifications import delivery as notify
    from agents.tools import http

    caplog.set_level(logging.DEBUG)
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS = 0.0
    port = receiver.server.server_address[1]
    slack = f"T0CANARY/B0CANARY/{secrets.token_hex(12)}"
    path = f"hooks/{secrets.token_hex(12)}"
    receiver.secret = notify.new_secret()
    hooks = [
        Webhook.objects.create(
            url=f"http://127.0.0.1:{port}/services/{slack}",
            format="slack",
            events=["run.done"],
            secret=notify.new_secret(),
        ),
        Webhook.objects.create(url=f"http://127.0.0.1:{port}/{path}", events=["run.done"], secret=receiver.secret),
    ]
    # A receiver that is down: the attempt fails, its error is logged.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}/{secrets.token_hex(12)}"
    hooks.append(Webhook.objects.create(url=down, events=["run.done"], secret=notify.new_secret()))
    receiver.statuses.extend([200, 500])  # one delivered, one failed
    drive(launch([{"final": "ok"}]))
    notify.dispatch()
    assert sorted(Delivery.objects.values_list("status", flat=True)) == ["delivered", "pending", "pending"]
    assert len(receiver.requests) == 2  # the secret URLs were really used
    # A fetched URL carrying a token (DNS stubbed to the loopback receiver).
    token = secrets.token_hex(12)
    settings.AIRLOCK_HTTP_ALLOWED_HOSTS = ["pages.example"]
    monkeypatch.setattr(http, "public_addresses", lambda host, port: ["127.0.0.1"])
    assert http.fetch(f"http://pages.example:{port}/private?token={token}")["status"] == 501  # GET: unsupported
    assert "webhook delivery=" in caplog.text  # the deliveries were logged, at DEBUG
    for secret in [slack, path, down, token, *(h.secret for h in hooks)]:
        assert secret not in caplog.text
