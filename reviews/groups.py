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

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from agents import access
from agents.actions.approvals import BatchResult
from agents.engine.policy import rule_label
from agents.models import Approval, ApprovalVote, Run
from agents.web.formatting import short_duration

from . import cards
from .cards import Card, Filters

PAGE = cards.PAGE  # entries (groups or lone cards) a page shows
GROUP_ROWS = 50  # a group's rows shown (and selectable); the rest are counted
VALUE_CHARS = 80  # a value longer than this is cut in the table, in full behind a toggle
REASON = "why asked"  # the pseudo-field for the policy's reason, when it differs
# What a group's row reads of a call, its run and profile: the columns of `Call`, in its
# order (args_sha256 and edited_args make its args_hash). Values, not Approvals: 50 rows
# a group, and building an Approval and its run for each cost three times the query.
CALL_COLUMNS = (
    "pk", "run_id", "run__created_by_id", "tool", "risk", "run__profile__name", "rule", "reason", "args", "required",
    "created_at", "args_sha256", "edited_args",
)


@dataclass(frozen=True)
class Cell:
    """A value as a group shows it: `text` (cut to VALUE_CHARS) and, when cut, `full`."""

    text: str
    full: str = ""

    @classmethod
    def of(cls, value: Any) -> Cell:
        if isinstance(value, str):
            text = value
        elif type(value) is int:  # json.dumps's spelling of an int, without the encoder
            text = str(value)
        else:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        if len(text) <= VALUE_CHARS:
            return cls(text)
        return cls(text[: VALUE_CHARS - 1] + "…", text)


@dataclass(frozen=True)
class Call:
    """A pending call as a group shows it: its row, or (the first) the group's header."""

    pk: int
    run_id: int
    launcher: int | None  # who launched the run (separation of duties)
    tool: str
    risk: str
    agent_name: str
    rule: Any
    reason: str
    args: Any
    required: int
    created_at: dt.datetime
    args_hash: str
    votes: tuple[ApprovalVote, ...] = ()  # this round's, for a call that needs several

    @classmethod
    def read(cls, row: Sequence[Any]) -> Call:
        """A call from the values of CALL_COLUMNS."""
        *head, stored, edited_args = row
        return cls(*head, args_hash=Approval.hash_of(stored, head[8], edited_args))

    @classmethod
    def of(cls, a: Approval) -> Call:
        """A call from an approval read as a card (cards._load), with its votes."""
        return cls(
            a.pk, a.run_id, a.run.created_by_id, a.tool, a.risk, a.agent_name, a.rule, a.reason, a.args, a.required,
            a.created_at, a.args_hash, tuple(cards._votes(a)),
        )

    @property
    def rule_label(self) -> str:
        return rule_label(self.rule) if isinstance(self.rule, dict) else ""


@dataclass
class Row:
    """One call of a group: its link, checkbox (id and args_hash) and age."""

    call: Call
    cells: list[Cell]
    waited: str
    since: int  # the call's creation, in seconds since the epoch (the page's clock advances it)
    votes: int = 0  # approvals counted this round, for a call that needs several
    mine: str = ""  # the viewer's vote this round, if any
    separated: bool = False  # the viewer launched the run and its duties are separated

    @property
    def args_hash(self) -> str:
        return self.call.args_hash

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
    def first(self) -> Call:
        return self.rows[0].call

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


def _shape(rows: list[Call]) -> tuple[list[str], list[str]]:
    """(fields the same in every row, fields that differ), each in the first row's order."""
    first = rows[0].args if isinstance(rows[0].args, dict) else {}
    same: list[str] = []
    differ: list[str] = []
    for name in first:
        value = first[name]
        alike = all(_alike(r.args.get(name), value) for r in rows if isinstance(r.args, dict))
        (same if alike else differ).append(name)
    return same, differ


def _alike(a: Any, b: Any) -> bool:
    """Whether two argument values are the same JSON: strings and numbers of one type
    compared as they are (most values: 50 rows a field), the rest as their JSON, which
    tells 1 from 1.0 and true."""
    if type(a) is type(b) and isinstance(a, (str, int, float)):
        return bool(a == b)
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def build_group(key: str, count: int, calls: list[Call], *, viewer: Any) -> Group:
    """The group card of `calls` (the shown rows, oldest first) of `count` in all."""
    same_names, differ = _shape(calls)
    reasons = {c.reason for c in calls}
    now = timezone.now()
    first = calls[0].args if isinstance(calls[0].args, dict) else {}
    same = [(name, Cell.of(first[name])) for name in same_names]
    if len(reasons) > 1:
        differ = [*differ, REASON]
    # The runs the viewer launched: whether their policies separate duties (few, if any).
    own = {c.run_id for c in calls if viewer is not None and c.launcher is not None and c.launcher == viewer.pk}
    runs = Run.objects.defer("script").in_bulk(own) if own else {}
    rows = []
    for c in calls:
        args = c.args if isinstance(c.args, dict) else {}
        mine = next((v.decision for v in c.votes if v.by_id == viewer.pk), "")
        rows.append(
            Row(
                call=c,
                cells=[Cell.of(c.reason) if name == REASON else Cell.of(args.get(name)) for name in differ],
                waited=short_duration((now - c.created_at).total_seconds()),
                since=int(c.created_at.timestamp()),
                votes=sum(v.decision == "approve" for v in c.votes),
                mine=mine,
                separated=c.run_id in runs and access.duties_separated(viewer, runs[c.run_id]),
            )
        )
    return Group(key=key, count=count, rows=rows, same=same, differ=differ)


def _rows(
    pending: QuerySet[Approval], counts: dict[str, int], lone: Sequence[int] = ()
) -> tuple[dict[str, list[Call]], dict[int, Approval]]:
    """The first GROUP_ROWS calls of each group (`counts`: key -> calls), oldest first,
    and the calls `lone` (by id) shown as cards. The groups that fit are read in one
    query with the lone calls (as cards read them: a query less a page, which cost more
    than the fields the rows carry along); each bigger group by its own LIMITed query
    along approval_pending_group (few a page: a window over every call of the page's
    groups sorted 5,000 rows to keep 50, and a UNION of one part a group cost more to
    compile than to run), as values (CALL_COLUMNS)."""
    small = [k for k, n in counts.items() if n <= GROUP_ROWS]
    by_key: dict[str, list[Call]] = {k: [] for k in counts}
    alone: dict[int, Approval] = {}
    wanted = set(lone)
    if small or lone:
        for a in cards._load(cards._select(pending.filter(Q(group_key__in=small) | Q(pk__in=lone)))):
            if a.pk in wanted:
                alone[a.pk] = a
            elif a.group_key in by_key:
                by_key[a.group_key].append(Call.of(a))
    for key in (k for k, n in counts.items() if n > GROUP_ROWS):
        found = pending.filter(group_key=key).order_by("created_at", "pk").values_list(*CALL_COLUMNS)[:GROUP_ROWS]
        by_key[key] = _with_votes([Call.read(row) for row in found])
    for calls in by_key.values():
        calls.sort(key=lambda c: (c.created_at, c.pk))
    return by_key, alone


def _with_votes(calls: list[Call]) -> list[Call]:
    """`calls` with this round's votes of those needing several (read as cards read
    them: none for the rest, which the first vote decides)."""
    several = [c.pk for c in calls if c.required > 1]
    if not several:
        return calls
    votes = {a.pk: tuple(cards._votes(a)) for a in cards._load(Approval.objects.filter(pk__in=several))}
    return [replace(c, votes=votes.get(c.pk, ())) for c in calls]


def pending_calls(user: Any, filters: Filters) -> QuerySet[Approval]:
    return cards._filtered(access.visible_approvals(user).pending(), filters, user)


WALK = 400  # pending calls read in queue order to find a page's entries, before counting all


def _entries(pending: QuerySet[Approval], first: int, count: int) -> list[dict[str, Any]]:
    """Entries `first` to `first + count` of the page order (a group's place is its
    oldest call's; a call without a key, its outcome unknown or its arguments edited,
    is an entry alone), each {"entry", "n", "one"}.

    The first K distinct keys met walking the pending calls oldest first are exactly the
    K entries whose oldest call comes first, so a short prefix of the queue order
    usually names a page's entries, and only their groups are counted. Where it does not
    (one group's calls fill the first WALK*4), every pending call is counted by key in
    the database: an index-only scan of approval_pending_group."""
    need = first + count
    limit = WALK if need <= WALK // 4 else WALK * 4  # later pages walk further
    walked = list(pending.order_by("created_at", "pk").values_list("group_key", "pk")[:limit])
    seen: dict[str, int] = {}
    for key, pk in walked:
        seen.setdefault(key or f"#{pk}", pk)
        if len(seen) >= need:
            break
    if len(seen) < need and len(walked) == limit:
        return _entries_counted(pending, first, count)
    page = list(seen.items())[first:need]
    counts = dict(
        pending.filter(group_key__in=[k for k, _pk in page if not k.startswith("#")])
        .values_list("group_key").annotate(n=Count("pk")).order_by()
    )
    return [{"entry": k, "n": counts.get(k, 1), "one": pk} for k, pk in page]


def _entries_counted(pending: QuerySet[Approval], first: int, count: int) -> list[dict[str, Any]]:
    groups_ = pending.exclude(group_key="").values("group_key").annotate(
        n=Count("pk"), first=Min("created_at"), one=Min("pk")
    ).order_by("first", "group_key")[: first + count]
    alone = pending.filter(group_key="").order_by("created_at", "pk").values("pk", "created_at")[: first + count]
    merged = [{"entry": g["group_key"], "n": g["n"], "first": g["first"], "one": g["one"]} for g in groups_]
    merged += [{"entry": f"#{a['pk']}", "n": 1, "first": a["created_at"], "one": a["pk"]} for a in alone]
    merged.sort(key=lambda e: (e["first"], e["one"]))
    return merged[first : first + count]


def group_page(user: Any, filters: Filters, *, page: int = 1, matching: int | None = None) -> GroupPage:
    """The grouped queue's page `page`: its entries, oldest call first."""
    pending = pending_calls(user, filters)
    entries = _entries(pending, (page - 1) * PAGE, PAGE + 1)
    has_next = len(entries) > PAGE
    entries = entries[:PAGE]
    rows, alone = _rows(
        pending, {e["entry"]: e["n"] for e in entries if e["n"] > 1}, [e["one"] for e in entries if e["n"] == 1]
    )
    lone = {c.approval.pk: c for c in cards.build(alone.values(), viewer=user)}
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
    if not key:
        return None
    pending = pending_calls(user, filters).filter(group_key=key)
    count = pending.count()
    if count == 1:
        last = cards.build(cards._load(cards._select(pending)), viewer=user)
        return last[0] if last else None
    calls = _rows(pending, {key: count})[0].get(key, []) if count else []
    return build_group(key, count, calls, viewer=user) if calls else None


OUTCOME_LABELS = {
    "decided": "decided", "already_decided": "already decided", "refused": "refused",
    "needs_more_votes": "needs more votes",
}


def summary(results: list[BatchResult]) -> str:
    """'2 decided, 1 already decided': the counts of a batch's outcomes, in a fixed order."""
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOME_LABELS}
    return ", ".join(f"{n} {OUTCOME_LABELS[o]}" for o, n in counts.items() if n) or "nothing decided"
