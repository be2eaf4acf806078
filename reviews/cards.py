"""What a review card shows, read in a constant number of queries however long the queue.

Read-only: decisions go through `agents.actions.approvals.approval_decide`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, F, Q, QuerySet, TextField, prefetch_related_objects
from django.db.models.functions import Cast
from django.db.models.lookups import IContains
from django.utils import timezone

from agents import access
from agents.engine import decisions
from agents.lib.rows import fetch
from agents.models import Approval, ApprovalVote, McpTool, ToolCall
from agents.web.formatting import short_duration

from .untrusted import Untrusted, untrusted

RISKS = ("read", "write", "irreversible")
PAGE = 25  # cards on a first page; "Show more" appends the next ones by keyset
LOADED_MAX = 200  # cards a polling page may hold: it names them all in every poll
# The queue's orders: value -> (label, ordering). Without an expiry a card sorts last.
SORTS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "": ("oldest first", ("created_at", "pk")),
    "expires": ("expires soonest", (F("expires_at").asc(nulls_last=True), "created_at", "pk")),
}
EXPIRING_FRACTION = 5  # a card is marked when less than a fifth of its time is left


CLAIMED = {"me": "Mine", "none": "Unclaimed"}  # ?claimed=: the queue's claim filters


@dataclass
class Filters:
    agent: str = ""
    tool: str = ""
    risk: str = ""
    sort: str = ""
    group: bool = False  # "Group similar calls" (reviews/groups.py): a view, not a filter
    page: int = 1  # the grouped view's page: not a filter, not carried on (polls, "more")
    claimed: str = ""  # of CLAIMED, or "" for every card
    q: str = ""  # text in the run's task, the tool or the arguments
    ignored: list[str] = field(default_factory=list)  # why a value given was not used
    # The project the pages are switched to (agents/web/projects.py): not in the query,
    # the session carries it.
    project: int | None = None

    def query(self) -> dict[str, str]:
        """The filters as the queue's URL carries them: polls, "more", decisions and
        claims send these on, so every view of the queue keeps them."""
        pairs = (
            ("agent", self.agent), ("tool", self.tool), ("risk", self.risk), ("sort", self.sort),
            ("claimed", self.claimed), ("q", self.q), ("group", "1" if self.group else ""),
        )
        return {k: v for k, v in pairs if v}

    @property
    def active(self) -> bool:
        # An order is not a filter: every pending card still shows.
        return bool(self.agent or self.tool or self.risk or self.claimed or self.q)


@dataclass
class Quorum:
    """Where an approval's votes stand, as its card shows them."""

    pk: int
    approvals: int
    required: int
    votes: list[ApprovalVote]

    @classmethod
    def of(cls, a: Approval) -> Quorum | None:
        """None for an approval that needs one vote and has none: no counter to show."""
        votes = _votes(a)
        if a.required <= 1 and not votes:
            return None
        count = decisions.tally([v.to_dict() for v in votes], a.required).approvals
        return cls(a.pk, count, a.required, votes)


@dataclass
class ToolSource:
    """Where an MCP tool comes from, as its card says: the server, the server's own
    description of the tool, and the risk an operator's override set (or "")."""

    server: str
    description: str
    risk_override: str
    annotated_risk: str  # what the server's annotations say

    @classmethod
    def of(cls, approvals: list[Approval]) -> dict[str, ToolSource]:
        """The sources of the MCP tools among `approvals`, by tool name: one query, none
        when no card is about an MCP tool (their names are SERVER__tool)."""
        names = {a.tool for a in approvals if "__" in a.tool}
        if not names:
            return {}
        tools = McpTool.objects.filter(name__in=names).select_related("server").only(
            "name", "description", "annotations", "risk_override", "server__name"
        )
        return {t.name: cls(t.server.name, t.description, t.risk_override, t.annotated().risk) for t in tools}


@dataclass(frozen=True)
class Prior:
    """A fork's "already ran" call as its parent recorded it (docs/retry.md): where, and
    the parent's result as text, or that its outcome is unknown."""

    run: int | None
    seq: int | None
    reusable: bool  # the parent's call finished: "Reuse that result" is offered
    result: str  # the parent's recorded result, shown as inert text ("" when unknown)
    missing: bool = False  # the parent's journal row is gone (purged or deleted)

    @classmethod
    def of(cls, approvals: list[Approval]) -> dict[int, Prior]:
        """The priors of `approvals` that have one, in one query for all."""
        asked = [a for a in approvals if a.prior]
        if not asked:
            return {}
        keys = [str(a.prior.get("key", "")) for a in asked]
        results = dict(ToolCall.objects.filter(idempotency_key__in=keys).values_list("idempotency_key", "result"))
        found = {}
        for a in asked:
            p = a.prior
            key = str(p.get("key", ""))
            result = results.get(key)
            found[a.pk] = cls(
                run=p.get("run"), seq=p.get("seq"), reusable=a.reusable,
                result=pretty_args(result) if a.reusable and result is not None else "", missing=key not in results,
            )
        return found


@dataclass
class ClaimLine:
    """Who is on a pending call, as its card says, and what the viewer may do about it."""

    pk: int
    by: str  # the claimant's name; "" when nobody holds a live claim
    until: dt.datetime | None
    mine: bool  # the viewer holds it
    may_claim: bool  # the viewer may claim the call (or extend their claim)
    may_release: bool  # theirs, or a superuser's release of anyone's
    token: str  # the claim shown, for the poll (see token_of())
    message: str = ""  # what a claim or release request is told

    @classmethod
    def of(cls, a: Approval, viewer: Any, *, separated: bool, now: dt.datetime) -> ClaimLine:
        live = a.claim_is_live(now)
        by = (a.claimed_by.get_username() if a.claimed_by else "?") if live else ""
        mine = live and viewer is not None and a.claimed_by_id == viewer.pk
        may = viewer is not None and access.can_decide(viewer) and not separated
        free = not live or mine
        return cls(
            a.pk, by, a.claimed_until if live else None, mine, may and free,
            live and viewer is not None and (mine or viewer.is_superuser), cls.token_of(a, now),
        )

    @staticmethod
    def token_of(a: Approval, now: dt.datetime) -> str:
        """The claim a card shows, as the poll names it back (`claim=<id>:<token>`): a
        card whose claim changed since (taken, extended, released, lapsed) gets its
        claim line again, out of band."""
        if not a.claim_is_live(now) or a.claimed_until is None:
            return "-"
        return f"{a.claimed_by_id}.{int(a.claimed_until.timestamp() * 1000)}"


@dataclass
class Card:
    approval: Approval
    args_json: str
    waited: str
    taint: Untrusted | None
    votes: list[ApprovalVote] = field(default_factory=list)  # this round's, oldest first
    my_vote: ApprovalVote | None = None  # the viewer's, this round
    separated: bool = False  # the viewer launched the run and its duties are separated
    late: bool = False  # this request's answer came after someone else's
    message: str = ""  # what the deciding request is told
    edit_error: str = ""  # why the reviewer's edited arguments were refused
    edit_text: str = ""  # those arguments, as typed, to correct
    source: ToolSource | None = None  # an MCP tool's server and description
    changed: str = ""  # why this request's answer was refused: the call changed since it was shown
    prior: Prior | None = None  # a fork's call that already ran in its parent
    claim: ClaimLine | None = None  # who is on it (pending cards only)
    may_decide: bool = True  # the viewer may answer this call (access.may_decide), not only see it

    @functools.cached_property
    def args_hash(self) -> str:
        """The call this card shows, by hash (Approval.args_hash), worked out once a card."""
        return self.approval.args_hash

    @property
    def pending(self) -> bool:
        return self.approval.is_pending

    def call_changed(self, *, refused: bool) -> None:
        """Mark the card as showing a call that changed since the viewer's page showed
        it (`refused`: their answer to the old call was not recorded)."""
        a = self.approval
        who = f"{self.edited_by} edited the arguments" if a.edited_args is not None else "the arguments changed"
        first = "Not recorded: the call changed" if refused else "The call changed"
        self.changed = (
            f"{first} since this card was shown ({who}). Review the arguments that will run now"
            f"{' and answer again' if refused else ''}."
        )

    @property
    def outcome_unknown(self) -> bool:
        return self.approval.kind == Approval.Kind.OUTCOME_UNKNOWN

    @property
    def already_ran(self) -> bool:
        return self.approval.kind == Approval.Kind.ALREADY_RAN

    @property
    def can_grant(self) -> bool:
        """Whether "Approve and allow for this run" may be offered (the same rule the
        decision applies: `Approval.grant_refusal`)."""
        return self.pending and self.approval.grant_refusal() is None

    @property
    def decided_label(self) -> str:
        return self.approval.decided_label

    @property
    def quorum(self) -> Quorum | None:
        return Quorum.of(self.approval)

    @property
    def approvals(self) -> int:
        return decisions.tally([v.to_dict() for v in self.votes], self.approval.required).approvals

    @property
    def missing(self) -> int:
        return max(0, self.approval.required - self.approvals)

    @property
    def edited_by(self) -> str:
        user = self.approval.edited_by
        return user.get_username() if user is not None else "a reviewer"

    @property
    def edited_json(self) -> str:
        return pretty_args(self.approval.edited_args)

    @property
    def run_json(self) -> str:
        """The arguments that would run: the edit when there is one."""
        a = self.approval
        return pretty_args(a.edited_args) if a.edited_args is not None else self.args_json

    @property
    def timeout_seconds(self) -> int:
        a = self.approval
        return round((a.expires_at - a.created_at).total_seconds()) if a.expires_at else 0

    @property
    def seconds_left(self) -> float:
        a = self.approval
        return (a.expires_at - timezone.now()).total_seconds() if a.expires_at else 0.0

    @property
    def time_left(self) -> str:
        return short_duration(self.seconds_left)

    @property
    def run_deadline_total(self) -> int:
        """The run's whole time, launch to deadline: what `run_deadline_left` is a part of."""
        run = self.approval.run
        return round((run.deadline - run.created_at).total_seconds())

    @property
    def run_deadline_left(self) -> str:
        """How long the run (and so this call, when it has no expiry of its own) has
        left: waiting for a human eats the run's deadline, and the card says so."""
        return short_duration((self.approval.run.deadline - timezone.now()).total_seconds())

    @property
    def run_deadline_expiring(self) -> bool:
        left = (self.approval.run.deadline - timezone.now()).total_seconds()
        return left * EXPIRING_FRACTION < self.run_deadline_total

    @property
    def expiring(self) -> bool:
        return self.approval.expires_at is not None and self.seconds_left * EXPIRING_FRACTION < self.timeout_seconds

    @property
    def decided_by(self) -> str:
        user = self.approval.decided_by
        return user.get_username() if user is not None else ""


def pretty_args(args: Any) -> str:
    return json.dumps(args, indent=2, ensure_ascii=False, default=str)


def pending_count(user: Any, project: int | None = None) -> int:
    """The badge's and the queue's count: pending calls `user` can see (in `project`)."""
    return access.visible_approvals(user, project=project).pending().count()


# Distinct tools by skipping through the partial index `approval_pending_tool`: one probe
# per tool instead of reading every pending row (a GROUP BY over 10,000 pending calls
# was the queue's slowest part, 1.4 ms). The count rides along in the same statement.
# The pending rule is ApprovalQuerySet.pending()'s; a test holds the two to the same answer.
_APPROVALS = Approval._meta.db_table
_SUMMARY_SQL = f"""
WITH RECURSIVE tools(tool) AS (
    SELECT (SELECT tool FROM {_APPROVALS} WHERE status = %s ORDER BY tool LIMIT 1)
    UNION ALL
    SELECT (SELECT a.tool FROM {_APPROVALS} a WHERE a.status = %s AND a.tool > tools.tool ORDER BY a.tool LIMIT 1)
    FROM tools WHERE tools.tool IS NOT NULL
)
SELECT (SELECT count(*) FROM {_APPROVALS} WHERE status = %s), tool FROM tools WHERE tool IS NOT NULL
"""


def pending_summary(user: Any, project: int | None = None) -> tuple[int, list[str]]:
    """How many pending approvals `user` can see (in `project`), and the tools they
    name, by name: the queue page's total and its tool filter's choices."""
    if project is not None or not access.reads_all_runs(user):
        # A project's calls, or a launcher's own: grouped through the scope's filter.
        rows = access.visible_approvals(user, project=project).pending().values_list("tool").annotate(n=Count("pk")).order_by("tool")
        by_tool = dict(rows)
        return sum(by_tool.values()), list(by_tool)
    pending = Approval.Status.PENDING
    rows = fetch(_SUMMARY_SQL, [pending, pending, pending])
    # No row: no pending tool, so nothing pending.
    return (rows[0][0] if rows else 0), [tool for _count, tool in rows]


def _filtered(qs: QuerySet[Approval], filters: Filters, user: Any) -> QuerySet[Approval]:
    if filters.agent:
        qs = qs.filter(run__profile__name=filters.agent)
    if filters.tool:
        qs = qs.filter(tool=filters.tool)
    if filters.risk:
        qs = qs.filter(risk=filters.risk)
    if filters.claimed:
        now = timezone.now()  # a lapsed claim is no claim (ApprovalQuerySet)
        qs = qs.claimed_by_user(user, now) if filters.claimed == "me" else qs.unclaimed(now)
    if filters.q:
        qs = qs.filter(_search(filters.q))
    return qs


def _search(text: str) -> Q:
    """Cards whose run's task, tool or arguments (the agent's or an edit's) contain
    `text`, in any case: one condition of the queue's query. The arguments are JSON,
    searched as their text (jsonb::text on PostgreSQL, the stored text on SQLite), so a
    key or a value matches."""
    return (
        Q(run__task__icontains=text)
        | Q(tool__icontains=text)
        | Q(IContains(Cast("args", TextField()), text))
        | Q(IContains(Cast("edited_args", TextField()), text))
    )


def _taint(a: Approval, journal: dict[str, ToolCall]) -> Untrusted | None:
    """What tainted the run, as a card shows it: the tainting call's result with its
    suspect passages flagged (reviews/untrusted.py), or that the result is missing."""
    source = a.taint_source if isinstance(a.taint_source, dict) else None
    if not source:
        return None
    call = journal.get(source.get("key", ""))
    if call is not None:
        return untrusted(call.tool, source.get("step", call.step), call.result)
    return Untrusted(tool=str(source.get("tool", "?")), step=source.get("step"), missing=True)


def taint_of(a: Approval) -> Untrusted | None:
    """One approval's taint evidence, as its card shows it (the email link's page)."""
    key = a.taint_source.get("key") if isinstance(a.taint_source, dict) else None
    journal = {
        c.idempotency_key: c
        for c in ToolCall.objects.filter(idempotency_key=key).only("idempotency_key", "tool", "step", "result")
    } if key else {}
    return _taint(a, journal)


def build(approvals: Iterable[Approval], *, viewer: Any = None, late: bool = False) -> list[Card]:
    approvals = list(approvals)
    keys = [a.taint_source["key"] for a in approvals if isinstance(a.taint_source, dict) and a.taint_source.get("key")]
    journal = {
        c.idempotency_key: c
        for c in ToolCall.objects.filter(idempotency_key__in=keys).only("idempotency_key", "tool", "step", "result")
    } if keys else {}
    now = timezone.now()
    sources = ToolSource.of(approvals)
    priors = Prior.of(approvals)
    cards = []
    for a in approvals:
        taint = _taint(a, journal)
        votes = _votes(a)
        separated = a.is_pending and viewer is not None and access.duties_separated(viewer, a.run)
        may = viewer is None or access.may_decide(viewer, a)
        cards.append(
            Card(
                approval=a,
                args_json=pretty_args(a.args),
                waited=short_duration(((a.decided_at or now) - a.created_at).total_seconds()),
                taint=taint,
                votes=votes,
                my_vote=next((v for v in votes if viewer is not None and v.by_id == viewer.pk), None),
                separated=separated,
                may_decide=may,
                late=late,
                source=sources.get(a.tool),
                prior=priors.get(a.pk),
                claim=ClaimLine.of(a, viewer, separated=separated or not may, now=now) if a.is_pending else None,
            )
        )
    return cards


# What a card reads of its run. Not the engine state or the script, which can be large
# (but the policy, read from the engine state, when the viewer launched the run), nor the
# counters and times: reading all of the run's columns cost the queue 0.4 ms.
CARD_RUN_FIELDS = ("task", "tainted", "state", "created_by", "profile", "purged_at", "created_at", "deadline")


def _select(qs: QuerySet[Approval]) -> QuerySet[Approval]:
    # Of the profile a card shows the name alone: building 25 profiles with their JSON
    # fields cost the queue more than its query. Votes and people: see _load().
    return (
        qs.select_related("run")
        .annotate(agent_name=F("run__profile__name"))
        .only(*(f.name for f in Approval._meta.concrete_fields), *(f"run__{f}" for f in CARD_RUN_FIELDS))
    )


def _load(qs: QuerySet[Approval]) -> list[Approval]:
    """The approvals of `qs` (a _select()), with their votes and who decided or edited,
    read only for the cards that can have them (Approval.prefetch_people): pending cards
    needing one vote (nearly all) have neither, and the users' joins and the votes'
    query were a third of the queue's reading."""
    approvals = list(qs)
    prefetch_related_objects([a for a in approvals if a.may_have_votes], "votes")  # see _votes()
    Approval.prefetch_people(approvals)
    # Claimants' names: one query, none when no card is claimed (most).
    prefetch_related_objects([a for a in approvals if a.claimed_by_id is not None], "claimed_by")
    return approvals


def _votes(a: Approval) -> list[ApprovalVote]:
    """The votes of this round, without a query for an approval that cannot have any
    (those _load() leaves out)."""
    return a.current_votes() if a.may_have_votes else []


@dataclass
class OnScreen:
    """A card the polling page already shows: it keeps its own element (hx-preserve),
    so the poll sends only this stand-in instead of rendering the card again."""

    pk: int
    # The vote counter goes out of band: the card stays, its count follows other reviewers.
    quorum: Quorum | None = None
    # So does the claim line, when the claim changed since the page showed it.
    claim: ClaimLine | None = None


@dataclass
class Page:
    """One answer of the queue: the cards, how many match, how many wait after them."""

    items: list[Card | OnScreen]
    matching: int  # pending cards matching the filters, in all
    rest: int  # pending cards after the last one here
    cursor: int | None  # the last card here: "Show more" continues after it


class BadCursor(ValueError):
    """A "more" cursor that names no approval the viewer can see."""


def _beyond(anchor: Approval, sort: str) -> Q:
    """Approvals after `anchor` in the queue's order `sort` (see SORTS): the keyset."""
    tie = Q(created_at__gt=anchor.created_at) | Q(created_at=anchor.created_at, pk__gt=anchor.pk)
    if sort != "expires":
        return tie
    if anchor.expires_at is None:  # nulls last: only other cards without an expiry follow
        return Q(expires_at__isnull=True) & tie
    return Q(expires_at__gt=anchor.expires_at) | Q(expires_at__isnull=True) | (Q(expires_at=anchor.expires_at) & tie)


def queue(
    user: Any,
    filters: Filters,
    *,
    keep: Iterable[int] = (),
    shown: Iterable[int] = (),
    after: int | None = None,
    matching: int | None = None,
    seen: dict[int, str] | None = None,
    claims: dict[int, str] | None = None,
) -> Page:
    """Pending cards in the chosen order, from the start or after the card `after`.

    A first page holds PAGE cards. A polling page says which cards it has: `shown`
    (pending there) and `keep` (decided there, to stay on screen); it gets as many cards
    as it shows, so cards appended by "Show more" stay. Those come back as stand-ins; a
    card shown as pending that someone else decided comes back not at all, so it leaves
    the page. `seen` maps a pending card on screen to the `args_hash` it shows: one whose
    call changed since (another reviewer edited it) comes back whole, marked, to replace
    the stale card. `matching` is the count of pending cards matching `filters`, when the
    caller has it already. `claims` maps a pending card on screen to the claim it shows
    (ClaimLine.token_of): one whose claim changed comes back as a stand-in carrying its
    claim line, out of band, so a half-written note survives another reviewer's claim.
    Raises BadCursor for an `after` the viewer cannot see.
    """
    visible = access.visible_approvals(user, project=filters.project)
    pending = _filtered(visible.pending(), filters, user)
    keep = list(keep)[:LOADED_MAX]
    shown = list(shown)[:LOADED_MAX]
    on_screen = set(keep) | set(shown)
    rows = _filtered(visible.filter(Q(status=Approval.Status.PENDING) | Q(pk__in=keep)), filters, user)
    beyond = Q()
    if after is not None:
        anchor = visible.filter(pk=after).only("pk", "created_at", "expires_at").first()
        if anchor is None:
            raise BadCursor(f"“after={after}” in the link names no call you can see in the queue")
        beyond = _beyond(anchor, filters.sort)
    order = SORTS.get(filters.sort, SORTS[""])[1]
    limit = min(max(PAGE, len(shown)), LOADED_MAX)
    approvals = _load(_select(rows.filter(beyond)).order_by(*order)[: limit + len(keep)])
    seen = seen or {}
    # Cards on screen whose call changed since they were rendered: sent again, not kept.
    stale = {a.pk for a in approvals if a.pk in seen and a.is_pending and seen[a.pk] != a.args_hash}
    on_screen -= stale
    built = iter(build((a for a in approvals if a.pk not in on_screen), viewer=user))
    claims = claims or {}
    now = timezone.now()

    def kept(a: Approval) -> OnScreen:
        if not a.is_pending:
            return OnScreen(a.pk)
        claim = None
        if a.pk in claims and claims[a.pk] != ClaimLine.token_of(a, now):
            claim = ClaimLine.of(a, user, separated=access.duties_separated(user, a.run), now=now)
        return OnScreen(a.pk, Quorum.of(a), claim)

    items: list[Card | OnScreen] = [kept(a) if a.pk in on_screen else next(built) for a in approvals]
    for item in items:
        if isinstance(item, Card) and item.approval.pk in stale:
            item.call_changed(refused=False)
    if matching is None:
        matching = pending.count()
    # The rows are a prefix of the order: every pending card up to the last one is here.
    here = sum(1 for a in approvals if a.is_pending)
    ahead = pending.filter(beyond).count() if after is not None else matching
    rest = max(ahead - here, 0)
    return Page(items, matching, rest, approvals[-1].pk if approvals and rest else None)


def all_votes(a: Approval) -> list[ApprovalVote]:
    """Every vote of every round (an edit starts a new one), oldest first."""
    return list(ApprovalVote.objects.filter(approval=a).order_by("at", "pk"))


def card(user: Any, approval_id: int, *, late: bool = False) -> Card | None:
    approvals = _load(_select(access.visible_approvals(user).filter(pk=approval_id)))
    return build(approvals, viewer=user, late=late)[0] if approvals else None


def filter_choices(tools: Iterable[str], user: Any, project: int | None = None) -> dict[str, list[Any]]:
    """The filter form's options; `tools` are those with pending calls (pending_summary),
    the agents those of `user`'s projects (of `project`)."""
    return {
        "agents": access.visible_profile_names(user, project=project),
        "tools": list(tools),
        "risks": list(RISKS),
        "sorts": [(value, label) for value, (label, _order) in SORTS.items()],
        "claimed": list(CLAIMED.items()),
    }
