"""Login lockout by username and address: django-axes' three hooks (settings.py names them).

- `client_ip`: the address a failure is counted against. REMOTE_ADDR, unless that is one
  of AIRLOCK_TRUSTED_PROXIES; then X-Forwarded-For, read from the right (each proxy
  appends the peer it saw), skipping trusted proxies, up to the first address that is
  not one. Entries further left are the client's own text and never believed.
- `attempted_username`: the username as typed, cut to what axes can store (a longer one
  was a 500 on PostgreSQL).
- `lockout_response`: the 429 page, saying what is locked (this username from this
  address) and until when, with Retry-After.
"""

from __future__ import annotations

import functools
import ipaddress
import math
from datetime import datetime, timedelta
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

USERNAME_MAX = AccessAttempt._meta.get_field("username").max_length or 255


def _address(text: str) -> Address | None:
    """One address as a proxy writes it (`192.0.2.1`, `2001:db8::1`, `[2001:db8::1]:443`,
    `192.0.2.1:443`), normalised (IPv4-mapped IPv6 unpacked, no zone); None if it is none."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id:
            return ipaddress.IPv6Address(text.partition("%")[0])
    return address


@functools.lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _trusted(address: Address, networks: tuple[Network, ...]) -> bool:
    return any(address in network for network in networks)


def client_ip(request: HttpRequest) -> str | None:
    peer = _address(str(request.META.get("REMOTE_ADDR", "")))
    networks = _networks(tuple(settings.AIRLOCK_TRUSTED_PROXIES))
    if peer is None or not _trusted(peer, networks):
        return str(peer) if peer is not None else None
    client = peer
    for hop in reversed(str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")):
        address = _address(hop)
        if address is None:
            # Garbled or empty: nothing left of it can be believed, so the failure counts
            # against the last hop a trusted proxy vouched for.
            break
        client = address
        if not _trusted(address, networks):
            break
    return str(client)


def attempted_username(request: HttpRequest, credentials: dict[str, Any] | None = None) -> str | None:
    # axes' own lookup: the credentials authenticate() got, else the POSTed form.
    field = settings.AXES_USERNAME_FORM_FIELD
    username = credentials.get(field) if credentials else getattr(request, "data", request.POST).get(field)
    return username[:USERNAME_MAX] if isinstance(username, str) else username


def lockout_ends(request: HttpRequest, credentials: dict[str, Any] | None) -> datetime | None:
    """When the lockout on this request lifts: for each locked set of attempts (axes'
    lockout parameters: here one, this username from this address), newest first, the
    attempt whose expiry brings the failures under the limit; the latest such time."""
    cool_off = get_cool_off(request) or timedelta(0)
    limit = get_failure_limit(request, credentials)
    ends = []
    for attempts in AxesProxyHandler.get_implementation().get_user_attempts(request, credentials):
        if (attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0) < limit:
            continue
        remaining = 0
        for attempt_time, failures in attempts.order_by("-attempt_time").values_list(
            "attempt_time", "failures_since_start"
        ):
            remaining += failures
            if remaining >= limit:
                ends.append(attempt_time + cool_off)
                break
    return max(ends, default=None)


def _in_words(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    if minutes < 120:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"about {round(minutes / 60)} hours"


def lockout_response(request: HttpRequest, *_: Any) -> HttpResponse:
    # axes passes (response, credentials) or, on its async path, (credentials); both are
    # on the request anyway.
    credentials = getattr(request, "axes_credentials", None)
    now = timezone.now()
    until = lockout_ends(request, credentials) or now + (get_cool_off(request) or timedelta(0))
    seconds = max(1, math.ceil((until - now).total_seconds()))
    # Shown to the minute, rounded up: at the time the page names, the pause is over.
    shown = (
        (until + timedelta(minutes=1)).replace(second=0, microsecond=0) if until.second or until.microsecond else until
    )
    context = {
        "username": get_client_username(request, credentials) or "",
        "address": getattr(request, "axes_ip_address", None) or "unknown",
        "failure_limit": get_failure_limit(request, credentials),
        "until": shown,
        "with_date": seconds >= 12 * 3600,
        "remaining": _in_words(seconds),
    }
    response = render(request, "registration/locked.html", context, status=settings.AXES_HTTP_RESPONSE_CODE)
    response["Retry-After"] = str(seconds)
    return response
