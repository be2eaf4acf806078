"""Calls waiting for a human: approvals, their votes, and run-scoped grants."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from django.conf import settings
from django.db import models
from django.db.models import Q, prefetch_related_objects
from django.utils import timezone
from pydantic import Field

from agents.engine import decisions, fingerprints
from agents.engine import policy as engine_policy


class ApprovalQuerySet(models.QuerySet["Approval"]):
    def pending(self) -> ApprovalQuerySet:
        return self.filter(status=Approval.Status.PENDING)

    # A claim whose `claimed_until` has passed is no claim, whether or not the sweeper
    # has cleared it yet (agents/actions/claims.py): these two are the queue's Mine / Unclaimed.
    def claimed_by_user(self, user: Any, now: dt.datetime) -> ApprovalQuerySet:
        return self.filter(claimed_by=user, claimed_until__gt=now)

    def unclaimed(self, now: dt.datetime) -> ApprovalQuerySet:
        return self.filter(Q(claimed_by__isnull=True) | Q(claimed_until__lte=now) | Q(claimed_until__isnull=True))


def call_group_key(*, profile_id: int, kind: str, tool: str, rule: Any, args: Any) -> str:
    """The key calls that look alike share, so the queue can show them as one group
    (docs/reviewing.md, "Groups and batches"): the same agent profile, the same tool, the
    same rule that asked (its origin and index; or none) and the same argument shape
    (the set of top-level keys). The rule's text counts too: launch rules are each run's
    own, so "rule 1 of the launch policy" of two runs may be two different rules.
    Worked out once, when the approval is written, so the grouped queue counts an
    indexed column instead of reading every pending call's arguments. "" for a call
    that is never grouped: one whose outcome is unknown."""
    if kind != decisions.POLICY:
        return ""
    asked = rule if isinstance(rule, dict) else None
    shape = sorted(args) if isinstance(args, dict) else type(args).__name__
    text = json.dumps([profile_id, tool, asked, shape], separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# The JSON shapes of an approval, a vote and a grant: the one definition each. to_dict()
# returns them (the API, webhooks, exports, commands); agents/api/schemas.py derives the
# OpenAPI schema from them (ApprovalOut, VoteOut, GrantOut): the fields in this order,
# with the description and default a `Field` gives (a field that may be null defaults
# to null). tests/api/test_schemas.py holds to_dict(), the schema and the OpenAPI
# document to each other, field by field and value by value.


class VoteDict(TypedDict):
    by: str
    decision: str
    note: str
    at: dt.datetime
    via: Annotated[str, Field("", description="where the vote came from: dashboard, api, slack or email")]


class GrantDict(TypedDict):
    id: int
    tool: str
    args: Any
    by: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


class ApprovalDict(TypedDict):
    id: int
    run: int
    status: str
    kind: str
    tool: str
    risk: str
    args: Any
    edited_args: Any
    edited_by: Annotated[str | None, Field(description="who edited the arguments, or null")]
    args_hash: Annotated[str, Field(
        description="sha256 of the canonical JSON of the arguments that would run (edited_args, else args): "
        "send it back with a decision to bind your vote to this call"
    )]
    reason: str
    taint_source: dict[str, Any] | None
    rule: dict[str, Any] | None
    shadow: Annotated[list[dict[str, Any]], Field(
        default_factory=list, description="what each matching shadow rule of the profile would have decided"
    )]
    history: Annotated[dict[str, Any] | None, Field(
        description="the figures of the history rule that asked (docs/policy.md, rules that remember), or null"
    )]
    required: int
    votes: list[VoteDict]
    decided_by: str | None
    decided_at: dt.datetime | None
    note: str
    expires_at: dt.datetime | None
    escalated_at: Annotated[dt.datetime | None, Field(
        description="when the call was escalated to its agent's backup group (escalate_after_seconds), or null"
    )]
    escalated_to: Annotated[str, Field("", description="the backup group it was escalated to (empty until then)")]
    via: Annotated[str, Field("", description="where the deciding answer came from: dashboard, api, slack, email (or empty)")]
    created_at: dt.datetime
    prior: Annotated[dict[str, Any] | None, Field(
        description="a fork's 'already ran' approval: the parent's call (run, seq, status succeeded|started)"
    )]
    claimed_by: Annotated[str | None, Field(
        description="who claimed the call (\"I'm on it\"), or null; null once the claim lapsed"
    )]
    claimed_until: Annotated[dt.datetime | None, Field(description="when the claim lapses, or null")]


# Where a decision came from (the approval JSON's `via`, the timeline, metrics).
CHANNELS = ("dashboard", "api", "slack", "email")


class Approval(models.Model):
    class Status(models.TextChoices):
        PENDING = decisions.PENDING
        APPROVED = decisions.APPROVED
        REJECTED = decisions.REJECTED
        EXPIRED = decisions.EXPIRED
        DENIED = decisions.DENIED

    class Kind(models.TextChoices):
        POLICY = decisions.POLICY
        OUTCOME_UNKNOWN = decisions.OUTCOME_UNKNOWN, "outcome unknown"
        ALREADY_RAN = decisions.ALREADY_RAN, "already ran"

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.POLICY)
    # The call this approval would run: the model's, or after an edit the reviewer's.
    idempotency_key = models.CharField(max_length=64)
    call_id = models.CharField(max_length=200)
    step = models.PositiveIntegerField(default=0)
    tool = models.CharField(max_length=100)
    args = models.JSONField(null=True, help_text="the arguments the model proposed")
    risk = models.CharField(max_length=20)
    reason = models.TextField()
    taint_source = models.JSONField(null=True, blank=True)
    rule = models.JSONField(null=True, blank=True, help_text="the rule that asked (with origin and index), or null")
    required = models.PositiveSmallIntegerField(default=1, help_text="votes needed")
    shadow = models.JSONField(
        default=list, blank=True, help_text='what the profile\'s shadow rules would have decided: [{"rule", "verdict"}]'
    )
    history = models.JSONField(
        null=True, blank=True, help_text="the deciding history rule's figures (engine.history.Reading), or null"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    decision = models.CharField(max_length=10, blank=True, help_text=", ".join(decisions.DECISIONS))
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    edited_args = models.JSONField(null=True, blank=True, help_text="a reviewer's arguments, run instead")
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Votes count within a round; an edit starts the next one (earlier votes were for
    # other arguments).
    round = models.PositiveSmallIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Where the deciding answer came from, of CHANNELS; "" while pending or when no
    # person decided (an expiry, the run ended).
    via = models.CharField(max_length=10, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # A claim ("I'm on it", docs/reviewing.md): tells, never stops another reviewer.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    claimed_until = models.DateTimeField(null=True, blank=True)
    # When the sweeper escalated the call to the profile's backup group (once), and that
    # group's name then: the record keeps it if the profile later names another.
    escalated_at = models.DateTimeField(null=True, blank=True)
    # Calls alike (agent, tool, the rule that asked, argument shape): call_group_key().
    group_key = models.CharField(max_length=32, blank=True, db_default="")
    escalated_to = models.CharField(max_length=150, blank=True, default="", db_default="")
    # Set when the run is purged (args, edited_args, note are then gone): args_hash as it was.
    args_sha256 = models.CharField(max_length=64, blank=True, db_default="")
    # An "already ran" approval of a fork (docs/retry.md): the parent's call, {"run",
    # "seq", "step", "status", "key"}; its result is read from the parent's journal.
    prior = models.JSONField(null=True, blank=True)
    # Folded into the review statistics' daily tallies (agents/ops/review_tally.py): a
    # closed call is counted there once, whenever its decision was committed.
    tallied = models.BooleanField(default=False, db_default=False)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["status", "created_at"], name="approval_status_created"),
            # The sweeper's "due" query and the queue's "expires soonest" order.
            models.Index(fields=["expires_at"], condition=models.Q(status=decisions.PENDING), name="approval_pending_expires"),
            # The queue's tool choices, read by skipping from tool to tool (reviews.cards).
            models.Index(fields=["tool"], condition=models.Q(status=decisions.PENDING), name="approval_pending_tool"),
            # The grouped queue counts pending calls by key, oldest first (reviews.groups).
            models.Index(
                fields=["group_key", "created_at", "id"], condition=models.Q(status=decisions.PENDING),
                name="approval_pending_group",
            ),
            # The review statistics' window and the fatigue's newest closed calls
            # (reviews/stats/): without it each read scanned every approval (bench/stats.py).
            models.Index(fields=["decided_at"], condition=models.Q(decided_at__isnull=False), name="approval_decided"),
            models.Index(fields=["escalated_at"], condition=models.Q(escalated_at__isnull=False), name="approval_escalated"),
            # The closed calls not yet folded into the tallies: the fold's work and the
            # stats page's exact tail (few, however long the history).
            models.Index(
                fields=["decided_at"], condition=models.Q(decided_at__isnull=False, tallied=False), name="approval_untallied"
            ),
        ]
        constraints = [
            # At most one open question per run: the engine waits on one call at a time.
            models.UniqueConstraint(
                fields=["run"], condition=models.Q(status=decisions.PENDING), name="approval_one_pending_per_run"
            )
        ]

    @property
    def is_pending(self) -> bool:
        return self.status == self.Status.PENDING

    @property
    def reusable(self) -> bool:
        """An "already ran" approval whose earlier call finished: its result can stand in."""
        return bool(self.prior) and (self.prior or {}).get("status") == "succeeded"

    @property
    def choices(self) -> tuple[str, ...]:
        return decisions.choices(self.kind, reusable=self.reusable)

    @property
    def decided_label(self) -> str:
        return decisions.label(self.decision, self.status)

    def claim_is_live(self, now: dt.datetime | None = None) -> bool:
        """Someone holds a claim that has not lapsed: a lapsed claim is treated as none
        everywhere, before the sweeper (or the next claim) records that it lapsed."""
        until = self.claimed_until
        return self.claimed_by_id is not None and until is not None and until > (now or timezone.now())

    @property
    def status_text(self) -> str:
        return decisions.status_text(self.status, self.decision)

    @staticmethod
    def prefetch_people(approvals: list[Approval]) -> None:
        """Read who decided or edited `approvals` in one query, and only if one of them
        names someone: most are pending and unedited, and joining the users table twice
        for them cost a page more than the rest of reading them."""
        if any(a.decided_by_id or a.edited_by_id for a in approvals):
            prefetch_related_objects(approvals, "decided_by", "edited_by")

    @property
    def may_have_votes(self) -> bool:
        """False for a pending approval that needs one vote: the first vote of a round
        decides it, in the transaction that records the vote, so outside that
        transaction it has none in its round."""
        return not (self.is_pending and self.required <= 1)

    @property
    def current_args(self) -> Any:
        """The arguments that would run: a reviewer's edit, or the agent's."""
        return self.edited_args if self.edited_args is not None else self.args

    @property
    def args_hash(self) -> str:
        """The hash a decision names to say it saw the call as it stands
        (engine.decisions.stale_vote); a purged run's approval keeps it stored."""
        return Approval.hash_of(self.args_sha256, self.args, self.edited_args)

    @staticmethod
    def hash_of(stored: str, args: Any, edited_args: Any) -> str:
        """`args_hash` from the columns alone (a group's rows read no instances)."""
        if stored:
            return stored
        return fingerprints.args_hash(edited_args if edited_args is not None else args)

    @property
    def edited(self) -> bool:
        """Someone edited the arguments (even back to the agent's): votes that name no
        call no longer count."""
        return self.round > 0

    def vote_record(self) -> list[VoteRecord]:
        """Every vote of every round, oldest first, each saying whether it counts for
        the call as it stands (this round) or was cast for arguments edited since: the
        record keeps votes that decided nothing (an expiry, an edit) in view."""
        votes = sorted(self.votes.all(), key=lambda v: (v.at, v.pk))
        return [VoteRecord(v, v.round == self.round and v.withdrawn_at is None) for v in votes]

    @staticmethod
    def counted_votes_sql(alias: str) -> str:
        """SQL counting the votes `current_votes()` returns (this round's, not withdrawn)
        of the approval read under table alias `alias`, for a statement to read beside it."""
        return (
            f"(SELECT count(*) FROM {ApprovalVote._meta.db_table} v WHERE v.approval_id = {alias}.id"
            f" AND v.round = {alias}.round AND v.withdrawn_at IS NULL)"
        )

    def attach(self, people: dict[str, Any], *, counted_votes: int | None) -> None:
        """Hand this approval what a statement read beside it: the users its foreign keys
        `people` name (as `select_related` attaches them, None for none) and, when none
        of its votes counts (`counted_votes_sql`), its votes: none, as a prefetch leaves
        them, so `to_dict()` reads nothing more."""
        for name, user in people.items():
            self._meta.get_field(name).set_cached_value(self, user)  # type: ignore[union-attr]
        if counted_votes == 0:
            self._prefetched_objects_cache = {"votes": ApprovalVote.objects.none()}

    def current_votes(self) -> list[ApprovalVote]:
        """This round's votes that count, oldest first (prefetched `votes` are used when
        present): a vote withdrawn because its voter left (agents/actions/people.py) is not one."""
        return sorted(
            (v for v in self.votes.all() if v.round == self.round and v.withdrawn_at is None), key=lambda v: (v.at, v.pk)
        )

    def grant_refusal(self) -> str | None:
        """Why approving this call may not also grant it for the run, or None."""
        return engine_policy.grant_refusal(
            risk=self.risk, required=self.required, tainted=self.run.tainted, kind=self.kind
        )

    def closes_at(self, run_deadline: dt.datetime | None = None) -> dt.datetime:
        """The last moment this call can be decided: its own expiry, or its run's
        deadline (which fails the run and expires the call), whichever comes first.
        `run_deadline` saves reading the run when the caller has it."""
        deadline = run_deadline if run_deadline is not None else self.run.deadline
        return min(self.expires_at, deadline) if self.expires_at is not None else deadline

    @property
    def rule_label(self) -> str:
        """'rule 2 of the profile' for an approval a rule asked for, else ''."""
        return engine_policy.rule_label(self.rule) if isinstance(self.rule, dict) else ""

    @property
    def shadow_labels(self) -> list[str]:
        """'shadow rule 3 would have allowed this', one per shadow rule that matched."""
        return [engine_policy.shadow_label(s) for s in self.shadow or ()]

    def to_dict(self) -> ApprovalDict:
        """The approval as the JSON API returns it (a run's `pending_approval` too)."""
        claimed = self.claim_is_live()
        return {
            "id": self.pk,
            "run": self.run_id,
            "status": self.status,
            "kind": self.kind,
            "tool": self.tool,
            "risk": self.risk,
            "args": self.args,
            "edited_args": self.edited_args,
            "edited_by": self.edited_by.get_username() if self.edited_by_id and self.edited_by else None,
            "args_hash": self.args_hash,
            "reason": self.reason,
            "taint_source": self.taint_source,
            "rule": self.rule,
            "shadow": self.shadow or [],
            "history": self.history,
            "required": self.required,
            "votes": [v.to_dict() for v in self.current_votes()],
            "decided_by": self.decided_by.get_username() if self.decided_by else None,
            "decided_at": self.decided_at,
            "note": self.note,
            "expires_at": self.expires_at,
            "escalated_at": self.escalated_at,
            "escalated_to": self.escalated_to,
            "via": self.via,
            "created_at": self.created_at,
            "prior": {k: self.prior.get(k) for k in ("run", "seq", "status")} if self.prior else None,
            "claimed_by": self.claimed_by.get_username() if claimed and self.claimed_by else None,
            "claimed_until": self.claimed_until if claimed else None,
        }


class ApprovalVote(models.Model):
    """One reviewer's answer to one round of an approval: a reviewer votes once a round
    (the constraint), so a second click or a retried request records nothing."""

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="votes", db_index=False)
    round = models.PositiveSmallIntegerField(default=0)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    # The name as it was when the vote was cast: votes stay readable if the user goes.
    by_name = models.CharField(max_length=150)
    decision = models.CharField(max_length=10)
    note = models.TextField(blank=True)
    # What this round was about: a reviewer's edited arguments, or null for the model's.
    # A later edit replaces the approval's `edited_args`; the record of this one stays.
    args = models.JSONField(null=True, blank=True)
    via = models.CharField(max_length=10, blank=True, default="", db_default="", help_text="dashboard, api, slack or email")
    at = models.DateTimeField()
    # The voter left before the call was decided (people.person_leave): the vote stays on
    # the record and no longer counts.
    withdrawn_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["approval", "round", "by_name"], name="vote_once_per_round"),
        ]

    def to_dict(self) -> VoteDict:
        return {"by": self.by_name, "decision": self.decision, "note": self.note, "at": self.at, "via": self.via}


@dataclass(frozen=True)
class VoteRecord:
    """A vote as the record shows it: `counts` is False for a vote cast on arguments
    someone edited afterwards, or withdrawn because its voter left."""

    vote: ApprovalVote
    counts: bool

    @property
    def withdrawn(self) -> bool:
        return self.vote.withdrawn_at is not None


class Grant(models.Model):
    """A run-scoped grant: a reviewer approved a call and let the same call (`args`
    set) or any call of the tool (`args` null) through for the rest of the run. The
    engine state holds it as grant `number`; this row is the record people read."""

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="grants", db_index=False)
    number = models.PositiveIntegerField(help_text="the engine's grant number within the run")
    approval = models.ForeignKey(Approval, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    tool = models.CharField(max_length=100)
    args = models.JSONField(null=True, blank=True, help_text="the exact call's arguments; null: any call of the tool")
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="grant_run_number")]
        ordering = ["run", "number"]

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def scope(self) -> str:
        return "tool" if self.args is None else "call"

    def to_dict(self) -> GrantDict:
        return {
            "id": self.pk,
            "tool": self.tool,
            "args": self.args,
            "by": self.by.get_username() if self.by else None,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


class ApprovalClaimQuerySet(models.QuerySet["ApprovalClaim"]):
    def open(self) -> ApprovalClaimQuerySet:
        return self.filter(ended_at__isnull=True)

    def close(self, end: str, now: dt.datetime) -> int:
        """End these claims (the open ones) as `end`; one whose time ran out before is
        recorded as lapsed at its `until` instead, whatever ended it later. A conditional
        update: of two closers of one claim the first wins, the other matches nothing."""
        open_ = self.open()
        lapsed = open_.filter(until__lte=now).update(ended_at=models.F("until"), end="lapsed")
        return lapsed + open_.filter(until__gt=now).update(ended_at=now, end=end)


class ApprovalClaim(models.Model):
    """One claim of an approval, from taking to letting go: the stats count the lapsed.

    `end`: decided (the claimant decided), released, logout, lapsed (its time ran out),
    left (the call left the queue otherwise: another reviewer decided, it expired, the
    run ended)."""

    ENDS = [(e, e) for e in ("decided", "released", "logout", "lapsed", "left")]

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="claims")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    claimed_at = models.DateTimeField(auto_now_add=True)
    until = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end = models.CharField(max_length=10, choices=ENDS, blank=True)

    objects = ApprovalClaimQuerySet.as_manager()

    class Meta:
        indexes = [
            # The sweeper's lapsed claims: the open ones are few, the ended ones pile up.
            models.Index(fields=["until"], condition=models.Q(ended_at__isnull=True), name="approvalclaim_open_until"),
            # The stats page's lapsed claims at the two ends of its window (reviews/stats/events.py).
            models.Index(fields=["ended_at"], condition=models.Q(end="lapsed"), name="approvalclaim_lapsed"),
        ]
