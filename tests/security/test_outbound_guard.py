"""The private-address guard of every outbound request (http_get, webhook deliveries)
against IPv6 forms that embed an IPv4 address: NAT64, 6to4,
IPv4-compatible, SIIT, and site-local fec0::/10.

No test here opens a connection to those addresses: DNS answers from a table and the
network backend is stubbed, recording each connection attempt and failing it. A guard
that lets an address through shows up as a recorded attempt instead of a refusal.
"""

from __future__ import annotations

import ipaddress
import socket
import types
from collections.abc import Callable
from typing import Any

import httpcore
import httpx
import pytest

from agents.models import Delivery, DeliveryAttempt, Run, Webhook
from agents.notifications import delivery as notify
from agents.tools import http
from agents.tools.http import UrlRefused

# (address, what the refusal names)
HOSTILE = [
    ("64:ff9b::a00:5", "embeds 10.0.0.5, a private or reserved address"),  # NAT64 well-known prefix
    ("64:ff9b::7f00:1", "embeds 127.0.0.1, a loopback address"),
    ("64:ff9b::a9fe:a9fe", "embeds 169.254.169.254, a link-local address"),  # cloud metadata
    ("64:ff9b:1::a00:5", "a local-use NAT64 address"),  # RFC 8215
    ("64:ff9b:1:a00:5::", "a local-use NAT64 address"),  # the same, with a /48 prefix
    ("2002:a00:5::1", "embeds 10.0.0.5, a private or reserved address"),  # 6to4
    ("2002:7f00:1::", "embeds 127.0.0.1, a loopback address"),
    ("::a00:5", "embeds 10.0.0.5, a private or reserved address"),  # IPv4-compatible
    ("::ffff:0:a00:5", "embeds 10.0.0.5, a private or reserved address"),  # SIIT
    ("fec0::1", "a site-local address"),
    ("::ffff:10.0.0.5", "a private or reserved address"),  # mapped: checked as 10.0.0.5
]
# Embedding a public IPv4 is fine: the guard must not refuse what is reachable anyway.
PUBLIC = ["64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111"]


class Network:
    """DNS from a table (a literal resolves to itself) and a network backend that
    records each connection attempt and fails it."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.connects: list[tuple[str, int]] = []

    def getaddrinfo(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        address = self.names.get(host, host.strip("[]"))
        if ":" in address:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        self.connects.append((host, port))
        raise httpcore.ConnectError("connections are stubbed in this test")


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> Network:
    net = Network()
    # Only the guard's lookups are answered from the table (the database driver keeps
    # the real resolver); every connection httpx would open goes through the backend.
    fake_socket = types.SimpleNamespace(
        getaddrinfo=net.getaddrinfo, gaierror=socket.gaierror, SOCK_STREAM=socket.SOCK_STREAM
    )
    monkeypatch.setattr(http, "socket", fake_socket)
    monkeypatch.setattr(
        httpcore.SyncBackend, "connect_tcp", lambda self, host, port, *a, **k: net.connect_tcp(host, port)
    )
    return net


@pytest.mark.parametrize(("address", "why"), HOSTILE)
def test_http_get_refuses_an_embedded_private_address_by_name_or_literal(
    network: Network, settings: Any, address: str, why: str
) -> None:
    network.names["shop.example"] = address
    settings.AIRLOCK_HTTP_ALLOWED_HOSTS = ["shop.example", httpx.URL(f"http://[{address}]/").host]
    for url in ("http://shop.example/", f"http://[{address}]/"):
        with pytest.raises(UrlRefused, match=why) as refused:
            http.fetch(url)
        assert "http_get only fetches public addresses" in str(refused.value)
    assert network.connects == []


@pytest.mark.parametrize("address", PUBLIC)
def test_http_get_connects_to_an_embedded_public_address(network: Network, settings: Any, address: str) -> None:
    network.names["shop.example"] = address
    settings.AIRLOCK_HTTP_ALLOWED_HOSTS = ["shop.example"]
    with pytest.raises(ConnectionError, match="connections are stubbed"):
        http.fetch("http://shop.example/")
    assert network.connects == [(address, 80)]  # the checked address, not a second lookup


@pytest.mark.parametrize(("address", "why"), HOSTILE)
def test_a_webhook_to_an_embedded_private_address_is_refused(
    network: Network, settings: Any, address: str, why: str
) -> None:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = []
    network.names["hooks.example"] = address
    for url in ("https://hooks.example/in", f"https://[{address}]/in"):
        with pytest.raises(UrlRefused, match=why):
            notify.post(url, b"{}", {})
    assert network.connects == []


@pytest.mark.django_db
def test_a_delivery_to_the_nat64_form_of_a_private_address_records_the_refusal(
    network: Network, settings: Any, launch: Callable[..., Run], drive: Callable[..., Run]
) -> None:
    """The probe's case: with a NAT64 gateway, http://[64:ff9b::a00:5]/ reaches 10.0.0.5."""
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = []
    Webhook.objects.create(url="http://[64:ff9b::a00:5]/hook", secret=notify.new_secret(), events=["run.done"])
    drive(launch([{"final": "ok"}]))
    notify.dispatch()
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code is None
    assert attempt.error.startswith(
        "refused: 64:ff9b::a00:5 resolves to 64:ff9b::a00:5, an address that embeds 10.0.0.5, a private or reserved address"
    )
    assert Delivery.objects.get().status == "pending"  # retried later, like any failure
    assert network.connects == []


@pytest.mark.parametrize(
    ("address", "inner"),
    [
        ("64:ff9b::a00:5", "10.0.0.5"),
        ("2002:a00:5::1", "10.0.0.5"),
        ("::a00:5", "10.0.0.5"),
        ("::ffff:0:a00:5", "10.0.0.5"),
        ("::ffff:a00:5", "10.0.0.5"),
        ("2606:4700:4700::1111", None),
    ],
)
def test_embedded_ipv4_reads_each_form(address: str, inner: str | None) -> None:
    found = http.embedded_ipv4(ipaddress.IPv6Address(address))
    assert (str(found) if found else None) == inner
