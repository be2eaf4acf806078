"""The `http_get` tool and the address checks every outbound request shares (webhook
deliveries use `public_addresses` too).

| tool | risk | returns | retry safety | why |
|---|---|---|---|---|
| http_get | read | external | safe | a GET; what it returns is someone else's text, so it taints the run |
"""

from __future__ import annotations

import html.parser
import ipaddress
import socket
from typing import Any
from urllib.parse import urljoin

import httpx
from django.conf import settings

from agents import demo
from agents.engine.registry import ToolContext, ToolSpec

MAX_BODY_BYTES = 512 * 1024
MAX_TEXT_CHARS = 20_000
MAX_REDIRECTS = 3


class UrlRefused(Exception):
    """http_get will not fetch this URL (scheme, allow-list or address)."""


def host_allowed(host: str) -> bool:
    """Exact names, or `.example.com` for a domain and its subdomains."""
    for entry in settings.AIRLOCK_HTTP_ALLOWED_HOSTS:
        entry = entry.lower().rstrip(".")
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False


# IPv6 forms that carry an IPv4 address, which a translator (NAT64, SIIT) or a tunnel
# (6to4) may deliver to: the IPv4 inside must itself be public. Python's `is_global`
# calls all of these global whatever they embed (issue 34, item 5).
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052 well-known prefix: the last 32 bits
SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")  # RFC 2765 IPv4-translated: the last 32 bits
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291, deprecated: the last 32 bits
# RFC 8215 local-use NAT64 prefix: the operator picks where the IPv4 sits (a /48 to /96
# prefix), so no one reading is right; IANA marks it not globally reachable.
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, SIIT, 6to4,
    IPv4-compatible, Teredo's client), if it has one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in NAT64 or ip in SIIT or ip in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an outbound request must not go to `ip` ("a loopback address", ...), or None
    for a public address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return refusal(ip.ipv4_mapped)
    if not ip.is_global or ip.is_multicast:
        kind = "loopback" if ip.is_loopback else "link-local" if ip.is_link_local else "private or reserved"
        return f"a {kind} address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:  # fec0::/10: deprecated, yet still routed inside some sites
            return "a site-local address"
        if ip in NAT64_LOCAL:
            return "a local-use NAT64 address"
        inner = embedded_ipv4(ip)
        why = refusal(inner) if inner is not None else None
        if why is not None:
            return f"an address that embeds {inner}, {why}"
    return None


def public_addresses(host: str, port: int) -> list[str]:
    """The host's addresses, refused if any is not a public (global) address."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UrlRefused(f"cannot resolve {host}: {exc}") from None
    addresses: list[str] = []
    for info in infos:
        raw = str(info[4][0]).split("%", 1)[0]
        ip = ipaddress.ip_address(raw)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        why = refusal(ip)
        if why is not None:
            raise UrlRefused(f"{host} resolves to {ip}, {why}; http_get only fetches public addresses")
        addresses.append(str(ip))
    if not addresses:
        raise UrlRefused(f"{host} has no address")
    return addresses


def get_pinned(url: httpx.URL, address: str, timeout: float) -> tuple[int, str, str, str | None]:
    """GET `url` from the address we checked (not a second DNS lookup, which could
    answer differently), with the real name in Host and in TLS SNI/verification."""
    host_header = url.host if url.port is None else f"{url.host}:{url.port}"
    target = url.copy_with(host=address)
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    headers = {"Host": host_header, "User-Agent": "Airlock-http_get/1"}
    # trust_env=False: a proxy from the environment would make its own DNS lookup.
    with (
        httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client,
        client.stream("GET", target, headers=headers, extensions=extensions) as response,
    ):
        body = b""
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) >= MAX_BODY_BYTES:
                break
        content_type = response.headers.get("content-type", "")
        text = body[:MAX_BODY_BYTES].decode(response.encoding or "utf-8", errors="replace")
        return response.status_code, content_type, text, response.headers.get("location")


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style", "noscript"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.parts.append(data.strip())


def html_text(text: str) -> str:
    parser = _Text()
    parser.feed(text)
    return "\n".join(parser.parts)


def fetch(raw_url: str, timeout: float = 10.0) -> dict[str, Any]:
    url_text = raw_url
    for _ in range(MAX_REDIRECTS + 1):
        try:
            url = httpx.URL(url_text)
        except (httpx.InvalidURL, TypeError) as exc:
            raise UrlRefused(f"not a valid URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise UrlRefused(f"only http and https URLs with a host are fetched, not {url_text!r}")
        host = url.host.lower().rstrip(".")
        if not host_allowed(host):
            allowed = ", ".join(settings.AIRLOCK_HTTP_ALLOWED_HOSTS) or "none"
            raise UrlRefused(f"{host} is not on the allow-list (AIRLOCK_HTTP_ALLOWED_HOSTS: {allowed})")
        if host == demo.DEMO_HOST:
            # The built-in demo site, answered in-process: no network call.
            text = demo.page_text(url.path)
            if text is None:
                return {"url": str(url), "status": 404, "text": "not found"}
            return {"url": str(url), "status": 200, "text": text}
        port = url.port or (443 if url.scheme == "https" else 80)
        address = public_addresses(host, port)[0]
        try:
            status, content_type, text, location = get_pinned(url, address, timeout)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"GET {url} failed: {type(exc).__name__}: {exc}") from None
        if status in (301, 302, 303, 307, 308) and location:
            url_text = urljoin(str(url), location)
            continue
        if "html" in content_type:
            text = html_text(text)
        return {"url": str(url), "status": status, "text": text[:MAX_TEXT_CHARS]}
    raise UrlRefused(f"more than {MAX_REDIRECTS} redirects")


def http_get(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return fetch(args["url"], timeout=max(1.0, ctx.timeout - 2))


TOOLS = [
    ToolSpec(
        "http_get", "Fetches a web page (only hosts on the allow-list) and returns its text.",
        {"type": "object", "properties": {"url": {"type": "string", "maxLength": 2000}},
         "required": ["url"], "additionalProperties": False},
        "read", "external", "safe", http_get, timeout=20,
    ),
]
