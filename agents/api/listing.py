"""The API's lists: keyset pages and the filters of `GET /api/runs`, `GET /api/runs/export`
and `GET /api/approvals`.

A page is `{"items": [...], "next": cursor | null}`; `?after=<cursor>` continues after
the last item of the page that gave it. The cursor is the last item's `(created_at, id)`,
so a page costs the same however deep it is, and items sharing a `created_at` are neither
repeated nor skipped (the id breaks the tie). Every bad value is a 400
`{"error": "invalid_filter", "detail": {"field": NAME, "message": ...}}`.
Who sees what is `agents.access` (visible_runs, visible_approvals); this only narrows.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Model, Q, QuerySet
from django.utils.dateparse import parse_date, parse_datetime
from ninja import Schema
from pydantic import Field

from agents.access import MAX_ID
from agents.actions.base import ActionError
from agents.engine import decisions, states
from agents.models import AgentProfile

PAGE_MAX = 200
PAGE_DEFAULT = 50
EXPORT_CHUNK = 500  # rows read per query while an export streams
TEXT_MAX = 200  # a search or a name longer than this matches nothing anyway
_NAME = re.compile(r"^[-a-zA-Z0-9_]+$")


def invalid(field: str, message: str) -> ActionError:
    return ActionError("invalid_filter", {"field": field, "message": message}, status=400)


# -- the query parameters, documented in the OpenAPI schema ------------------------------
# Plain strings: every value is checked here, so a bad one is an invalid_filter naming
# its field rather than a validation error about types.

_TIME = "an ISO 8601 date or date-time (UTC unless it says otherwise), e.g. 2026-12-01 or 2026-12-01T09:30:00Z"


class RunFilters(Schema):
    state: str | None = Field(None, description="one of " + ", ".join(states.STATES))
    agent: str | None = Field(None, description="an agent profile's name")
    launched_by: str | None = Field(None, description="the launcher's username")
    since: str | None = Field(None, description=f"created at or after: {_TIME}")
    until: str | None = Field(None, description=f"created before: {_TIME}")
    q: str | None = Field(None, description="text the task contains (case-insensitive)")


class RunPageQuery(RunFilters):
    after: str | None = Field(None, description="the `next` cursor of the previous page")
    limit: str | None = Field(None, description=f"items per page, 1 to {PAGE_MAX} (default {PAGE_DEFAULT})")


class RunExportQuery(RunFilters):
    transitions: str | None = Field(None, description="1: each run also carries its `transitions`")


class ApprovalPageQuery(RunPageQuery):
    status: str | None = Field(None, description="one of " + ", ".join(decisions.STATUSES))
    tool: str | None = Field(None, description="the tool's name")


# -- reading the values --------------------------------------------------------------


def _text(params: dict[str, Any], field: str, *, max_length: int = TEXT_MAX) -> str | None:
    value = params.get(field)
    if value is None or value == "":
        return None
    if len(value) > max_length:
        raise invalid(field, f"longer than {max_length} characters")
    if "\x00" in value:
        raise invalid(field, "contains a NUL character")
    return str(value)


def _choice(params: dict[str, Any], field: str, choices: tuple[str, ...]) -> str | None:
    value = _text(params, field)
    if value is not None and value not in choices:
        raise invalid(field, f"{value[:40]!r} is not one of {', '.join(choices)}")
    return value


def _time(params: dict[str, Any], field: str) -> dt.datetime | None:
    value = _text(params, field, max_length=64)
    if value is None:
        return None
    # An unencoded "+01:00" arrives as " 01:00": read it as the offset it was.
    candidates = [value, *([value[: value.rindex(" ")] + "+" + value[value.rindex(" ") + 1 :]] if " " in value else [])]
    parsed: dt.datetime | None = None
    for candidate in candidates:
        try:
            parsed = parse_datetime(candidate)
            if parsed is None and (day := parse_date(candidate)) is not None:
                parsed = dt.datetime.combine(day, dt.time.min)
        except ValueError:  # well formed, but no such day or hour
            parsed = None
        if parsed is not None:
            break
    if parsed is None:
        raise invalid(field, f"not {_TIME}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # year 1 or 9999 with an offset that leaves the calendar
        raise invalid(field, "out of range") from None


def _limit(params: dict[str, Any]) -> int:
    value = _text(params, "limit", max_length=10)
    if value is None:
        return PAGE_DEFAULT
    if not (value.isascii() and value.isdigit() and 1 <= int(value) <= PAGE_MAX):
        raise invalid("limit", f"an integer from 1 to {PAGE_MAX}")
    return int(value)


def _flag(params: dict[str, Any], field: str) -> bool:
    value = _text(params, field, max_length=10)
    if value is None or value in ("0", "false"):
        return False
    if value in ("1", "true"):
        return True
    raise invalid(field, "1 or 0")


# -- cursors ----------------------------------------------------------------------------


def cursor_of(row: Any) -> str:
    raw = f"{row.created_at.astimezone(dt.UTC).isoformat()}|{row.pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor(params: dict[str, Any]) -> tuple[dt.datetime, int] | None:
    value = _text(params, "after", max_length=100)
    if value is None:
        return None
    try:
        stamp, _bar, pk = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode().rpartition("|")
        at = parse_datetime(stamp)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        at, pk = None, ""
    if at is None or at.tzinfo is None or not (pk.isascii() and pk.isdigit() and 0 < int(pk) <= MAX_ID):
        raise invalid("after", "not a cursor this list gave (use the `next` of the previous page)")
    return at, int(pk)


# -- filters ---------------------------------------------------------------------------


def run_filters(params: dict[str, Any], *, run: str = "") -> Q:
    """The runs filters as a Q; `run` is the path to the run ("run__" for approvals).
    `since` and `until` are always on the listed row's own `created_at`."""
    where = Q()
    if state := _choice(params, "state", states.STATES):
        where &= Q(**{f"{run}state": state})
    if agent := _text(params, "agent", max_length=64):
        if not _NAME.match(agent) or not AgentProfile.objects.filter(name=agent).exists():
            raise invalid("agent", f"no agent profile named {agent[:64]!r}")
        where &= Q(**{f"{run}profile__name": agent})
    if launched_by := _text(params, "launched_by", max_length=150):
        # An unknown name matches nothing, like a known one with no runs: names stay private.
        where &= Q(**{f"{run}created_by__username": launched_by})
    since, until = _time(params, "since"), _time(params, "until")
    if since and until and until < since:
        raise invalid("until", "earlier than since")
    if since:
        where &= Q(created_at__gte=since)
    if until:
        where &= Q(created_at__lt=until)
    if q := _text(params, "q"):
        where &= Q(**{f"{run}task__icontains": q})
    return where


def approval_filters(params: dict[str, Any]) -> Q:
    where = run_filters(params, run="run__")
    if status := _choice(params, "status", decisions.STATUSES):
        where &= Q(status=status)
    if tool := _text(params, "tool"):
        where &= Q(tool=tool)
    return where


# -- pages and streams -------------------------------------------------------------------


@dataclass(frozen=True)
class Order:
    newest_first: bool

    @property
    def fields(self) -> tuple[str, str]:
        return ("-created_at", "-pk") if self.newest_first else ("created_at", "pk")

    def beyond(self, at: dt.datetime, pk: int) -> Q:
        if self.newest_first:
            return Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk)
        return Q(created_at__gt=at) | Q(created_at=at, pk__gt=pk)


NEWEST_FIRST, OLDEST_FIRST = Order(True), Order(False)


def _nothing(rows: list[Any]) -> None:
    pass


def page(
    rows: QuerySet[Any],
    params: dict[str, Any],
    order: Order,
    serialize: Callable[[Any], Any],
    *,
    prepare: Callable[[list[Any]], None] = _nothing,
) -> dict[str, Any]:
    """One page of `rows` (already filtered and scoped) after the `after` cursor;
    `prepare` reads what `serialize` needs of the whole page at once."""
    limit, after = _limit(params), _cursor(params)
    if after is not None:
        rows = rows.filter(order.beyond(*after))
    found = list(rows.order_by(*order.fields)[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    prepare(found)
    return {"items": [serialize(r) for r in found], "next": cursor_of(found[-1]) if more else None}


def stream(rows: QuerySet[Model], order: Order, *, prepare: Callable[[list[Any]], None] = _nothing) -> Iterator[Model]:
    """Every row of `rows`, in `order`, read EXPORT_CHUNK at a time by keyset: no
    transaction is held open while the client reads, and rows added meanwhile at the
    far end are not repeated."""
    after: tuple[dt.datetime, int] | None = None
    while True:
        chunk = rows.filter(order.beyond(*after)) if after else rows
        found = list(chunk.order_by(*order.fields)[:EXPORT_CHUNK])
        prepare(found)
        yield from found
        if len(found) < EXPORT_CHUNK:
            return
        after = (found[-1].created_at, found[-1].pk)


def wants_transitions(params: dict[str, Any]) -> bool:
    return _flag(params, "transitions")
