"""The help desk's tools: http_get's allow-list and address checks, email deduplication, refunds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from agents.demo import DEMO_HOST, PLANTED_INSTRUCTION
from agents.engine.registry import ToolContext
from agents.models import AgentProfile, LedgerEntry, ToolCall
from agents.tools import demo, http, mail
from agents.tools.http import UrlRefused, fetch
from tests.helpers import call, final


def test_demo_host_is_answered_in_process_with_the_planted_page() -> None:
    page = fetch(f"https://{DEMO_HOST}/shipping")
    assert page["status"] == 200 and PLANTED_INSTRUCTION in page["text"]
    assert fetch(f"https://{DEMO_HOST}/nope")["status"] == 404


def test_host_outside_the_allow_list_is_refused() -> None:
    with pytest.raises(UrlRefused, match=r"example.com is not on the allow-list \(AIRLOCK_HTTP_ALLOWED_HOSTS: demo.airlock.internal\)"):
        fetch("https://example.com/")


@pytest.mark.parametrize("url,kind", [
    ("http://localhost/", "loopback"),
    ("http://127.0.0.1:8000/admin/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://10.1.2.3/", "private or reserved"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
])
def test_private_addresses_are_refused_even_when_allow_listed(settings, url, kind) -> None:
    settings.AIRLOCK_HTTP_ALLOWED_HOSTS = ["localhost", "127.0.0.1", "::1", "10.1.2.3", "169.254.169.254"]
    with pytest.raises(UrlRefused, match=f"a {kind} address; http_get only fetches public addresses"):
        fetch(url)


def test_only_http_urls_are_fetched() -> None:
    with pytest.raises(UrlRefused, match="only http and https"):
        fetch("file:///etc/passwd")


def test_subdomain_entries_allow_the_domain_and_its_subdomains(settings) -> None:
    settings.AIRLOCK_HTTP_ALLOWED_HOSTS = [".example.com"]
    assert http.host_allowed("example.com") and http.host_allowed("docs.example.com")
    assert not http.host_allowed("badexample.com")


@pytest.fixture
def web_server() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, "host": self.headers["Host"]})
            body = b"<html><script>evil()</script><h1>Hello</h1><p>page text</p></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_get_connects_to_the_checked_address_with_the_real_host_name(web_server) -> None:
    port, seen = web_server
    status, _, text, _, _ = http.get_pinned(httpx.URL(f"http://shop.example:{port}/a?b=1"), "127.0.0.1", 5)
    assert status == 200 and seen == [{"path": "/a?b=1", "host": f"shop.example:{port}"}]
    assert http.html_text(text) == "Hello\npage text"


@pytest.mark.django_db(transaction=True)
def test_refusal_reaches_the_model_as_a_clear_tool_result(defaults, launch, drive) -> None:
    AgentProfile.objects.create(name="fetcher", provider="scripted", tools=["http_get"])
    run = drive(launch([call("http_get", url="http://169.254.169.254/latest/meta-data/"), final("ok")], agent="fetcher"))
    assert run.state == "done"
    result = ToolCall.objects.get(run=run).result
    assert result["ok"] is False and result["error"] == "UrlRefused"
    assert "169.254.169.254 is not on the allow-list" in result["detail"]
    assert "UrlRefused" in run.messages.get(role="tool").content


@pytest.mark.django_db(transaction=True)
def test_send_email_sends_once_per_idempotency_key(defaults, launch, mailoutbox) -> None:
    run = launch([final()])
    ctx = ToolContext(run_id=str(run.pk), idempotency_key="k" * 64, timeout=5)
    args = {"to": "dana@example.com", "subject": "Hi", "body": "Hello"}
    first = mail.send_email(args, ctx)
    second = mail.send_email(args, ctx)
    assert first["sent"] is True and second == {**second, "sent": False, "duplicate": True}
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["dana@example.com"]
    assert LedgerEntry.objects.filter(idempotency_key="k" * 64).count() == 1


@pytest.mark.django_db(transaction=True)
def test_failed_send_leaves_no_row_so_a_retry_sends(defaults, launch, settings, mailoutbox) -> None:
    run = launch([final()])
    ctx = ToolContext(run_id=str(run.pk), idempotency_key="e" * 64, timeout=5)
    args = {"to": ["dana@example.com"], "subject": "Hi", "body": "Hello"}
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", 9  # nothing listens on the discard port
    with pytest.raises(OSError):
        mail.send_email(args, ctx)
    assert not LedgerEntry.objects.exists()
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert mail.send_email(args, ctx)["sent"] is True and len(mailoutbox) == 1


@pytest.mark.django_db(transaction=True)
def test_refund_of_an_unknown_order_is_an_error(defaults, launch) -> None:
    run = launch([final()])
    with pytest.raises(demo.UnknownOrder, match="no order '9999'"):
        demo.refund({"order_id": "9999", "reason": "x"}, ToolContext(str(run.pk), "r" * 64, 5))
    assert not LedgerEntry.objects.exists()
