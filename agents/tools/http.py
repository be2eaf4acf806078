"""The `http_get` tool and what every outbound request shares (webhook deliveries use
`public_addresses`, `Deadline` and `client` too): the public-address guard, an overall
deadline per request and a cap on the body read (docs/security.md, "Outbound requests").

| tool | risk | returns | retry safety | why |
|---|---|---|---|---|
| http_get | read | external | safe | a GET; what it returns is someone else's text, so it taints the run |
"""

from __future__ import annotations

import functools
import html.parser
import ipaddress
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urljoin

import httpcore
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
# calls all of these global whatever they embed.
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


# -- an overall deadline per request ------------------------------
# httpx's timeouts bound each socket operation, so a server sending a byte just inside
# the read timeout keeps a request alive forever. `Deadline` bounds the whole exchange:
# every connect, TLS handshake, write and read gets at most the time left (CPython's
# SSL calls honour a socket timeout over the whole operation), and none starts after it.

E = TypeVar("E", bound=httpcore.TimeoutException)
R = TypeVar("R")


class Deadline:
    """A point in time (monotonic) by which one exchange (or a few: redirects) is over."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def bounded(self, error: type[E], timeout: float | None, op: Callable[[float], R]) -> R:
        """`op(timeout)` with the timeout cut to the time left; `error` once it is gone."""
        left = self.remaining()
        if left <= 0:
            raise error(f"over the overall deadline of {self.seconds:g} s")
        try:
            return op(left if timeout is None else min(timeout, left))
        except httpcore.TimeoutException:
            if self.remaining() <= 0:
                raise error(f"over the overall deadline of {self.seconds:g} s") from None
            raise


class _DeadlineStream(httpcore.NetworkStream):
    WRITE_PIECE = 16 * 1024  # each piece is one bounded write

    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self.inner = inner
        self.deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.deadline.bounded(httpcore.ReadTimeout, timeout, lambda t: self.inner.read(max_bytes, t))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), self.WRITE_PIECE):
            piece = buffer[start : start + self.WRITE_PIECE]
            self.deadline.bounded(httpcore.WriteTimeout, timeout, functools.partial(self.inner.write, piece))

    def close(self) -> None:
        self.inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        tls = self.deadline.bounded(
            httpcore.ConnectTimeout, timeout, lambda t: self.inner.start_tls(ssl_context, server_hostname, t)
        )
        return _DeadlineStream(tls, self.deadline)

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, deadline: Deadline) -> None:
        self.inner = httpcore.SyncBackend()
        self.deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self.deadline.bounded(
            httpcore.ConnectTimeout,
            timeout,
            lambda t: self.inner.connect_tcp(host, port, t, local_address, socket_options),
        )
        return _DeadlineStream(stream, self.deadline)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's verifying context, built once per process (building one reads the whole
    CA bundle, about 30 ms of CPU); a context is safe to share between threads."""
    return httpx.create_ssl_context(trust_env=False)


class _DeadlineTransport(httpx.HTTPTransport):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__(verify=tls_context(), trust_env=False)
        # httpx takes no network backend, so its pool is rebuilt with ours (the same
        # arguments as its own for a client with default limits and no proxy).
        self._pool = httpcore.ConnectionPool(
            ssl_context=tls_context(),
            max_connections=httpx.Limits().max_connections,
            network_backend=_DeadlineBackend(deadline),
        )


def client(deadline: Deadline) -> httpx.Client:
    """A client whose every request ends by `deadline`; no redirects followed (a redirect
    could point inside: callers check each hop), no proxy from the environment (a proxy
    would make its own DNS lookup, past the address guard)."""
    return httpx.Client(
        transport=_DeadlineTransport(deadline),
        timeout=max(0.001, deadline.seconds),
        follow_redirects=False,
        trust_env=False,
    )


def read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, decoded (gzip, deflate) but never past `limit`
    either (a small compressed body can unpack to gigabytes); True if there was more."""
    raw = b""
    more = False
    for chunk in response.iter_raw():
        raw += chunk
        if len(raw) > limit:
            raw, more = raw[:limit], True
            break
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw, more
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise httpx.DecodingError(f"the response is encoded with {encoding!r}, which is not decoded")
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # a zlib or a gzip header, as it comes
    try:
        body = decoder.decompress(raw, limit)
    except zlib.error as exc:
        raise httpx.DecodingError(f"cannot decode the {encoding} response: {exc}") from None
    return body, more or bool(decoder.unconsumed_tail)


def get_pinned(url: httpx.URL, address: str, timeout: float | Deadline) -> tuple[int, str, str, str | None, bool]:
    """GET `url` from the address we checked (not a second DNS lookup, which could
    answer differently), with the real name in Host and in TLS SNI/verification.
    Returns status, content type, text, location and whether the body was cut."""
    deadline = timeout if isinstance(timeout, Deadline) else Deadline(timeout)
    host_header = url.host if url.port is None else f"{url.host}:{url.port}"
    target = url.copy_with(host=address)
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    # Only encodings read_capped can decode within its cap.
    headers = {"Host": host_header, "User-Agent": "Airlock-http_get/1", "Accept-Encoding": "gzip, deflate"}
    with (
        client(deadline) as session,
        session.stream("GET", target, headers=headers, extensions=extensions) as response,
    ):
        body, cut = read_capped(response, MAX_BODY_BYTES)
        content_type = response.headers.get("content-type", "")
        text = body.decode(response.encoding or "utf-8", errors="replace")
        return response.status_code, content_type, text, response.headers.get("location"), cut


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
    """GET a page: allow-listed host, public address, at most MAX_REDIRECTS hops, all of
    them within one deadline of `timeout` seconds, at most MAX_BODY_BYTES read."""
    deadline = Deadline(timeout)
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
            status, content_type, text, location, cut = get_pinned(url, address, deadline)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"GET {url} failed: {type(exc).__name__}: {exc}") from None
        if status in (301, 302, 303, 307, 308) and location:
            url_text = urljoin(str(url), location)
            continue
        if "html" in content_type:
            text = html_text(text)
        page: dict[str, Any] = {"url": str(url), "status": status, "text": text[:MAX_TEXT_CHARS]}
        if cut:
            page["truncated"] = f"the page is larger than {MAX_BODY_BYTES // 1024} KiB; only that much was read"
        return page
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
