"""The grouped queue (`?group=1`): pending calls alike shown as one card each.

Calls alike share `Approval.group_key` (agent profile, tool, the rule that asked,
argument shape; `call_group_key()`), worked out when the approval was written. A page is
PAGE entries in the order of their oldest call: a group of two or more calls, or a call
alone (its ordinary card). Three queries however long the queue: the entries (counted by
key in the database), the rows of the page's groups (at most GROUP_ROWS each, by a
window function), and the page's lone cards. Read-only: a group's form posts the ids it
shows to `reviews:decisions`, which decides each through `approval_decide`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, CharField, Count, F, Min, QuerySet, Value, When, Window
from django.db.models.functions import Cast, Concat, RowNumber
from django.utils import timezone

from agents import access
from agents.actions import BatchResult
from agents.models import Approval
from agents.web.formatting import short_duration

from . import cards
from .cards import Card, Filters

PAGE = cards.PAGE  # entries (groups or lone cards) a page shows
GROUP_ROWS = 50  # a group's rows shown (and selectable); the rest are counted
VALUE_CHARS = 80  # a value longer than this is cut in the table, in full behind a toggle
REASON = "why asked"  # the pseudo-field for the policy's reason, when it differs


@dataclass(frozen=True)
class Cell:
    """A value as a group shows it: `text` (cut to VALUE_CHARS) and, when cut, `full`."""

    text: str
    full: str = ""

    @classmethod
    def of(cls, value: Any) -> Cell:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        if len(text) <= VALUE_CHARS:
            return cls(text)
        return cls(text[: VALUE_CHARS - 1] + "…", text)


@dataclass
class Row:
    """One call of a group: its link, checkbox (id and args_hash) and age."""

    approval: Approval
    cells: list[Cell]
    waited: str
    votes: int = 0  # approvals counted this round, for a call that needs several
    mine: str = ""  # the viewer's vote this round, if any
    separated: bool = False  # the viewer launched the run and its duties are separated

    @property
    def args_hash(self) -> str:
        return self.approval.args_hash

    @property
    def selectable(self) -> bool:
        return not (self.mine or self.separated)


@dataclass
class Group:
    """Two or more pending calls alike: what they share once, what differs per row."""

    key: str
    count: int
    rows: list[Row]
    same: list[tuple[str, Cell]]
    differ: list[str]
    results: list[BatchResult] = field(default_factory=list)  # a batch's answer, shown above it

    @property
    def first(self) -> Approval:
        return self.rows[0].approval

    @property
    def more(self) -> int:
        return self.count - len(self.rows)

    @property
    def selectable(self) -> int:
        return sum(r.selectable for r in self.rows)


@dataclass
class GroupPage:
    items: list[Group | Card]
    matching: int  # pending calls matching the filters
    page: int  # 1-based
    has_next: bool


def _entry() -> Case:
    # A call without a key (its outcome is unknown, or someone edited it) is an entry alone.
    return Case(
        When(group_key="", then=Concat(Value("#"), Cast("pk", CharField()))),
        default=F("group_key"),
        output_field=CharField(),
    )


def _shape(rows: list[Approval]) -> tuple[list[str], list[str]]:
    """(fields the same in every row, fields that differ), each in the first row's order."""
    first = rows[0].args if isinstance(rows[0].args, dict) else {}
    same, differ = [], []
    for name in first:
        values = {json.dumps(r.args.get(name), sort_keys=True, default=str) for r in rows if isinstance(r.args, dict)}
        (same if len(values) == 1 else differ).append(name)
    return same, differ


def build_group(key: str, count: int, approvals: list[Approval], *, viewer: Any) -> Group:
    """The group card of `approvals` (the shown rows, oldest first) of `count` in all."""
    same_names, differ = _shape(approvals)
    reasons = {a.reason for a in approvals}
    now = timezone.now()
    first = approvals[0].args if isinstance(approvals[0].args, dict) else {}
    same = [(name, Cell.of(first[name])) for name in same_names]
    if len(reasons) > 1:
        differ = [*differ, REASON]
    rows = []
    for a in approvals:
        args = a.args if isinstance(a.args, dict) else {}
        votes = cards._votes(a)
        mine = next((v.decision for v in votes if v.by_id == viewer.pk), "")
        rows.append(
            Row(
                approval=a,
                cells=[Cell.of(a.reason) if name == REASON else Cell.of(args.get(name)) for name in differ],
                waited=short_duration((now - a.created_at).total_seconds()),
                votes=sum(v.decision == "approve" for v in votes),
                mine=mine,
                separated=access.duties_separated(viewer, a.run),
            )
        )
    return Group(key=key, count=count, rows=rows, same=same, differ=differ)


def _rows(pending: QuerySet[Approval], keys: list[str]) -> dict[str, list[Approval]]:
    """The first GROUP_ROWS calls of each group in `keys`, oldest first: one query."""
    if not keys:
        return {}
    ranked = pending.filter(group_key__in=keys).annotate(
        nth=Window(RowNumber(), partition_by=[F("group_key")], order_by=[F("created_at").asc(), F("pk").asc()])
    )
    shown = cards._load(cards._select(ranked.filter(nth__lte=GROUP_ROWS)).order_by("group_key", "created_at", "pk"))
    by_key: dict[str, list[Approval]] = {k: [] for k in keys}
    for a in shown:
        by_key[a.group_key].append(a)
    return by_key


def pending_calls(user: Any, filters: Filters) -> QuerySet[Approval]:
    return cards._filtered(access.visible_approvals(user).pending(), filters)


def group_page(user: Any, filters: Filters, *, page: int = 1, matching: int | None = None) -> GroupPage:
    """The grouped queue's page `page`: its entries, oldest call first."""
    pending = pending_calls(user, filters)
    entries = list(
        pending.values(entry=_entry())
        .annotate(n=Count("pk"), first=Min("created_at"), one=Min("pk"))
        .order_by("first", "entry")[(page - 1) * PAGE : page * PAGE + 1]
    )
    has_next = len(entries) > PAGE
    entries = entries[:PAGE]
    keys = [e["entry"] for e in entries if e["n"] > 1]
    rows = _rows(pending, keys)
    lone = {c.approval.pk: c for c in cards.build(
        cards._load(cards._select(pending.filter(pk__in=[e["one"] for e in entries if e["n"] == 1]))), viewer=user
    )}
    items: list[Group | Card] = []
    for e in entries:
        if e["n"] > 1 and rows.get(e["entry"]):
            items.append(build_group(e["entry"], e["n"], rows[e["entry"]], viewer=user))
        elif e["one"] in lone:
            items.append(lone[e["one"]])
    if matching is None:
        matching = pending.count()
    return GroupPage(items, matching, page, has_next)


def group_of(user: Any, key: str, filters: Filters) -> Group | Card | None:
    """The group `key` as it stands now (after a batch): a group while two or more of
    its calls wait, the last one's card, or None when none is left."""
    pending = pending_calls(user, filters).filter(group_key=key)
    count = pending.count()
    if count == 0 or not key:
        return None
    approvals = _rows(pending, [key]).get(key, [])
    if count == 1 and approvals:
        return cards.build(approvals, viewer=user)[0]
    return build_group(key, count, approvals, viewer=user) if approvals else None


OUTCOME_LABELS = {
    "decided": "decided", "already_decided": "already decided", "refused": "refused",
    "needs_more_votes": "needs more votes",
}


def summary(results: list[BatchResult]) -> str:
    """'2 decided, 1 already decided': the counts of a batch's outcomes, in a fixed order."""
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOME_LABELS}
    return ", ".join(f"{n} {OUTCOME_LABELS[o]}" for o, n in counts.items() if n) or "nothing decided"
