"""What a review card shows, read in a constant number of queries however long the queue.

Read-only: decisions go through `agents.actions.approval_decide`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from agents import access
from agents.formatting import short_duration
from agents.models import AgentProfile, Approval, ToolCall

from .untrusted import Untrusted, untrusted

RISKS = ("read", "write", "irreversible")
PAGE = 100  # cards on one page; the queue says how many more wait

DECIDED_LABELS = {
    "approve": "Approved",
    "reject": "Rejected",
    "happened": "Marked as happened",
    "retry": "Run again",
    "fail": "Run failed",
}


@dataclass
class Filters:
    agent: str = ""
    tool: str = ""
    risk: str = ""

    def query(self) -> dict[str, str]:
        return {k: v for k, v in (("agent", self.agent), ("tool", self.tool), ("risk", self.risk)) if v}

    @property
    def active(self) -> bool:
        return bool(self.query())


@dataclass
class Card:
    approval: Approval
    args_json: str
    waited: str
    taint: Untrusted | None
    late: bool = False  # this request's answer came after someone else's
    message: str = ""  # what the deciding request is told

    placeholder = False

    @property
    def pending(self) -> bool:
        return self.approval.status == "pending"

    @property
    def outcome_unknown(self) -> bool:
        return self.approval.kind == "outcome_unknown"

    @property
    def decided_label(self) -> str:
        a = self.approval
        if a.status == "expired":
            return "Expired"
        return DECIDED_LABELS.get(a.decision, a.status.capitalize())

    @property
    def decided_by(self) -> str:
        user = self.approval.decided_by
        return user.get_username() if user is not None else ""


def pretty_args(args: Any) -> str:
    return json.dumps(args, indent=2, ensure_ascii=False, default=str)


def pending_count(user: Any) -> int:
    return access.visible_approvals(user).filter(status="pending").count()


def _filtered(qs: QuerySet[Approval], filters: Filters) -> QuerySet[Approval]:
    if filters.agent:
        qs = qs.filter(run__profile__name=filters.agent)
    if filters.tool:
        qs = qs.filter(tool=filters.tool)
    if filters.risk:
        qs = qs.filter(risk=filters.risk)
    return qs


def build(approvals: Iterable[Approval], *, late: bool = False) -> list[Card]:
    approvals = list(approvals)
    keys = [a.taint_source["key"] for a in approvals if isinstance(a.taint_source, dict) and a.taint_source.get("key")]
    journal = {
        c.idempotency_key: c
        for c in ToolCall.objects.filter(idempotency_key__in=keys).only("idempotency_key", "tool", "step", "result")
    } if keys else {}
    now = timezone.now()
    cards = []
    for a in approvals:
        taint = None
        source = a.taint_source if isinstance(a.taint_source, dict) else None
        if source:
            call = journal.get(source.get("key", ""))
            if call is not None:
                taint = untrusted(call.tool, source.get("step", call.step), call.result)
            else:
                taint = Untrusted(tool=str(source.get("tool", "?")), step=source.get("step"), missing=True)
        cards.append(
            Card(
                approval=a,
                args_json=pretty_args(a.args),
                waited=short_duration(((a.decided_at or now) - a.created_at).total_seconds()),
                taint=taint,
                late=late,
            )
        )
    return cards


def _select(qs: QuerySet[Approval]) -> QuerySet[Approval]:
    # The run's engine state and script can be large; a card needs neither.
    return qs.select_related("run__profile", "decided_by").defer("run__engine", "run__script")


@dataclass
class OnScreen:
    """A card the polling page already shows: it keeps its own element (hx-preserve),
    so the poll sends only this stand-in instead of rendering the card again."""

    pk: int
    placeholder: bool = True


def queue(
    user: Any, filters: Filters, *, keep: Iterable[int] = (), shown: Iterable[int] = ()
) -> tuple[list[Card | OnScreen], int]:
    """Pending cards oldest first, and how many pending cards match the filters in all.

    A polling page says which cards it has: `shown` (pending there) and `keep` (decided
    there, to stay on screen). Those come back as stand-ins; a card shown as pending that
    someone else decided comes back not at all, so it leaves the page.
    """
    pending = _filtered(access.visible_approvals(user).filter(status="pending"), filters)
    keep = list(keep)[:PAGE]
    on_screen = set(keep) | set(shown)
    rows = _filtered(access.visible_approvals(user).filter(Q(status="pending") | Q(pk__in=keep)), filters)
    approvals = list(_select(rows).order_by("created_at", "pk")[: PAGE + len(keep)])
    built = iter(build(a for a in approvals if a.pk not in on_screen))
    items: list[Card | OnScreen] = [OnScreen(a.pk) if a.pk in on_screen else next(built) for a in approvals]
    return items, pending.count()


def card(user: Any, approval_id: int, *, late: bool = False) -> Card | None:
    approval = _select(access.visible_approvals(user).filter(pk=approval_id)).first()
    return build([approval], late=late)[0] if approval is not None else None


def filter_choices(user: Any) -> dict[str, list[str]]:
    tools = access.visible_approvals(user).filter(status="pending").order_by("tool").values_list("tool", flat=True).distinct()
    return {
        "agents": list(AgentProfile.objects.order_by("name").values_list("name", flat=True)),
        "tools": list(tools),
        "risks": list(RISKS),
    }
