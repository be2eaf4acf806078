"""Slow and greedy peers: httpx's timeouts bound each read, so a
receiver sending one byte a second kept http_get and a webhook delivery busy far past
the timeout, long enough for a delivery to outlive its claim and be sent twice. Every
outbound request now has an overall deadline, and what it reads is capped.

The peer is a real server on loopback (tests/slow_server.py) answering a byte every
50 ms; the tests assert on outcomes (the error, the delivery's row, what the peer saw),
never on durations.
"""

from __future__ import annotations

import gzip
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trustme
from django.db import connection

from agents.models import Delivery, DeliveryAttempt, Run, Webhook
from agents.notifications import delivery as notify
from agents.tools import http
from tests.slow_server import SlowServer, response

DEADLINE = 0.5  # AIRLOCK_WEBHOOK_TIMEOUT and http_get's timeout in these tests
# A well-formed answer that takes 0.05 s x 200 bytes = 10 s to arrive, one byte at a time:
# longer than the deadline, and longer than a delivery's claim (2 x 0.5 + 5 = 6 s).
PADDED = response(headers={"X-Padding": "x" * 140, "Content-Type": "text/plain"}, body=b"hello")


@pytest.fixture
def peers() -> Iterator[Callable[[SlowServer], SlowServer]]:
    started: list[SlowServer] = []

    def _start(server: SlowServer) -> SlowServer:
        started.append(server.start())
        return server

    yield _start
    for server in started:
        server.stop()


@pytest.fixture
def hooks(settings: Any) -> Any:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.AIRLOCK_WEBHOOK_TIMEOUT = DEADLINE
    settings.AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS = 3600.0  # a retry is not due during the test
    return settings


def delivery_to(url: str, launch: Callable[..., Run], drive: Callable[..., Run]) -> int:
    Webhook.objects.create(url=url, events=["run.done"], secret=notify.new_secret())
    drive(launch([{"final": "ok"}]))
    notify.fan_out()
    return Delivery.objects.get().pk


def fetch_from(server: SlowServer, settings: Any, monkeypatch: Any, path: str = "/page") -> dict[str, Any]:
    """http_get of a page on `server`, its name resolved (stubbed DNS) to loopback."""
    settings.AIRLOCK_HTTP_ALLOWED_HOSTS = ["pages.example"]
    monkeypatch.setattr(http, "public_addresses", lambda host, port: ["127.0.0.1"])
    scheme = "https" if server.tls else "http"
    return http.fetch(f"{scheme}://pages.example:{server.port}{path}", timeout=DEADLINE)


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def tls_for(ca: trustme.CA, name: str = "pages.example") -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(context)
    return context


def trusting(ca: trustme.CA, monkeypatch: Any) -> None:
    """The outbound client trusts the test CA (and nothing else: the real context is
    replaced, verification stays on)."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    monkeypatch.setattr(http, "tls_context", lambda: context)


# -- the overall deadline ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_webhook_receiver_trickling_its_answer_is_abandoned_at_the_deadline_and_retried(
    hooks: Any, peers: Any, launch: Any, drive: Any
) -> None:
    server = peers(SlowServer.trickling(PADDED))
    pk = delivery_to(server.url(), launch, drive)
    assert notify.attempt(pk) is False
    delivery = Delivery.objects.get(pk=pk)
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, None)
    assert delivery.last_error == f"ReadTimeout: over the overall deadline of {DEADLINE:g} s"
    assert delivery.next_attempt_at is not None  # retried with back-off, like any failure
    assert DeliveryAttempt.objects.get().error == delivery.last_error
    [exchange] = server.exchanges
    assert b"webhook-signature" in exchange.request.lower()  # it was sent, once
    assert not exchange.finished and exchange.sent < len(PADDED)


@pytest.mark.django_db(transaction=True)
def test_a_trickling_receiver_never_gets_the_same_delivery_twice_at_once(
    hooks: Any, peers: Any, launch: Any, drive: Any
) -> None:
    """While one worker's attempt is stuck on a slow receiver, a second worker keeps
    trying to claim the delivery. The claim outlasts the attempt's deadline, so the
    second worker never gets it while the first may still be sending."""
    server = peers(SlowServer.trickling(PADDED))
    pk = delivery_to(server.url(), launch, drive)
    outcomes: list[bool | None] = []

    def first_worker() -> None:
        try:
            outcomes.append(notify.attempt(pk))
        finally:
            connection.close()

    worker = threading.Thread(target=first_worker)
    worker.start()
    assert server.arrived.wait(timeout=30)  # a hang guard, not a measurement
    second: list[bool | None] = []
    while worker.is_alive():
        second.append(notify.attempt(pk))
        worker.join(timeout=0.05)
    worker.join()
    assert outcomes == [False]
    assert set(second) <= {None}  # every claim of the second worker lost: it sent nothing
    assert server.max_in_flight == 1 and len(server.exchanges) == 1
    assert Delivery.objects.get(pk=pk).attempts == 1


def test_http_get_from_a_server_trickling_its_headers_fails_with_a_clear_error(
    settings: Any, monkeypatch: Any, peers: Any
) -> None:
    server = peers(SlowServer.trickling(PADDED))
    with pytest.raises(ConnectionError, match=rf"failed: ReadTimeout: over the overall deadline of {DEADLINE:g} s"):
        fetch_from(server, settings, monkeypatch)
    [exchange] = server.exchanges
    assert not exchange.finished


def test_http_get_from_a_server_trickling_its_body_fails_with_a_clear_error(
    settings: Any, monkeypatch: Any, peers: Any
) -> None:
    head = response(headers={"Content-Type": "text/plain", "Content-Length": "200"})
    server = peers(SlowServer(lambda: iter([head, *(b"x" for _ in range(200))])))
    with pytest.raises(ConnectionError, match=rf"failed: ReadTimeout: over the overall deadline of {DEADLINE:g} s"):
        fetch_from(server, settings, monkeypatch)
    assert not server.exchanges[0].finished


def test_http_gets_deadline_covers_its_redirects(settings: Any, monkeypatch: Any, peers: Any) -> None:
    """Each hop answers within the deadline, but the four together do not."""
    hop = response("302 Found", {"Location": "/next"})  # 8 bytes per 50 ms: about 0.4 s a hop
    server = peers(SlowServer.trickling(hop, piece=8))
    with pytest.raises(ConnectionError, match=r"over the overall deadline"):
        fetch_from(server, settings, monkeypatch)


def test_https_is_verified_against_the_real_name_through_the_deadline(
    settings: Any, monkeypatch: Any, peers: Any, ca: trustme.CA
) -> None:
    """The deadline's network backend keeps TLS as it was: the pinned address is
    dialled, the certificate checked against the URL's name."""
    page = response(headers={"Content-Type": "text/plain"}, body=b"hello over tls")
    server = peers(SlowServer(lambda: iter([page]), interval=0, tls=tls_for(ca)))
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch_from(server, settings, monkeypatch)  # the test CA is not trusted yet
    trusting(ca, monkeypatch)
    assert fetch_from(server, settings, monkeypatch)["text"] == "hello over tls"
    wrong = peers(SlowServer(lambda: iter([page]), interval=0, tls=tls_for(ca, "other.example")))
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch_from(wrong, settings, monkeypatch)


def test_https_from_a_server_trickling_its_answer_fails_at_the_deadline(
    settings: Any, monkeypatch: Any, peers: Any, ca: trustme.CA
) -> None:
    trusting(ca, monkeypatch)
    server = peers(SlowServer.trickling(PADDED, tls=tls_for(ca)))
    with pytest.raises(ConnectionError, match=rf"failed: ReadTimeout: over the overall deadline of {DEADLINE:g} s"):
        fetch_from(server, settings, monkeypatch)
    assert not server.exchanges[0].finished


# -- the body cap -----------------------------------------------------------------------


def test_http_get_reads_at_most_the_cap_and_says_so(settings: Any, monkeypatch: Any, peers: Any) -> None:
    big = response(headers={"Content-Type": "text/plain"}, body=b"a" * (4 * http.MAX_BODY_BYTES))
    server = peers(SlowServer(lambda: iter([big]), interval=0))
    page = fetch_from(server, settings, monkeypatch)
    assert page["status"] == 200 and page["text"] == "a" * http.MAX_TEXT_CHARS
    assert page["truncated"] == "the page is larger than 512 KiB; only that much was read"


def test_http_get_unpacks_a_compressed_page_no_further_than_the_cap(
    settings: Any, monkeypatch: Any, peers: Any
) -> None:
    """A gzip bomb: 64 MiB of zeros in a few kilobytes."""
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
    answer = response(headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, body=bomb)
    server = peers(SlowServer(lambda: iter([answer]), interval=0))
    page = fetch_from(server, settings, monkeypatch)
    assert page["status"] == 200 and len(page["text"]) == http.MAX_TEXT_CHARS
    assert "truncated" in page


def test_http_get_refuses_an_encoding_it_cannot_bound(settings: Any, monkeypatch: Any, peers: Any) -> None:
    answer = response(headers={"Content-Type": "text/plain", "Content-Encoding": "br"}, body=b"\x0b\x02\x80hi\x03")
    server = peers(SlowServer(lambda: iter([answer]), interval=0))
    with pytest.raises(
        ConnectionError, match=r"DecodingError: the response is encoded with 'br', which is not decoded"
    ):
        fetch_from(server, settings, monkeypatch)


@pytest.mark.django_db
def test_a_webhook_receivers_answer_is_never_read(hooks: Any, peers: Any, launch: Any, drive: Any) -> None:
    """A 2xx delivers whatever follows it: a receiver sending an endless body neither
    fills our memory nor holds the attempt."""
    head = response(headers={"Content-Length": str(1 << 40)})

    def endless() -> Iterator[bytes]:
        yield head
        for _ in range(1024):  # 64 MiB at most: the peer is bounded too
            yield b"z" * 65536

    server = peers(SlowServer(endless, interval=0))
    pk = delivery_to(server.url(), launch, drive)
    assert notify.attempt(pk) is True
    delivery = Delivery.objects.get(pk=pk)
    assert (delivery.status, delivery.last_status_code, delivery.last_error) == ("delivered", 200, "")
    assert server.settled()
    [exchange] = server.exchanges
    assert exchange.hung_up and not exchange.finished
