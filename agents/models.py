"""The ledger of runs: profiles, runs, immutable transitions, the transcript, the
tool-call journal, approvals and the diagnostic side-effect ledger."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any, TypedDict

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator, URLValidator
from django.db import connection, models
from django.db.models import Sum, prefetch_related_objects
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from agents import rows
from agents.engine import decisions, states
from agents.engine import policy as engine_policy
from agents.engine.limits import DEFAULTS, Limits
from agents.llm import API_KEY_ENV


class AgentProfileQuerySet(models.QuerySet["AgentProfile"]):
    def launchable(self) -> AgentProfileQuerySet:
        """The profiles a launch may offer, by name: scripted ones only while
        AIRLOCK_ALLOW_SCRIPTED is on."""
        profiles = self.order_by("name")
        if not settings.AIRLOCK_ALLOW_SCRIPTED:
            profiles = profiles.exclude(provider="scripted")
        return profiles


class AgentProfile(models.Model):
    PROVIDERS = [(p, p) for p in ("scripted", "demo", "openai", "anthropic")]

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    provider = models.CharField(max_length=20, choices=PROVIDERS)
    model_name = models.CharField(max_length=100, blank=True)
    # Micro-dollars per million tokens: $3/Mtok is 3_000_000.
    price_input_micros = models.PositiveBigIntegerField(default=0)
    price_output_micros = models.PositiveBigIntegerField(default=0)
    # Prompt-cache prices (OpenAI: cached input; Anthropic: cache reads and writes).
    # Empty means "the input price", so a profile priced before these existed costs the same.
    price_cached_input_micros = models.PositiveBigIntegerField(null=True, blank=True)
    price_cache_write_micros = models.PositiveBigIntegerField(null=True, blank=True)
    # Where this profile's model lives: empty means the provider's environment default
    # (OPENAI_BASE_URL / ANTHROPIC_BASE_URL). The key itself is never stored: only the
    # NAME of the environment variable that holds it (empty: OPENAI_API_KEY / ANTHROPIC_API_KEY).
    base_url = models.URLField(max_length=500, blank=True)
    api_key_env = models.CharField(
        max_length=100, blank=True,
        validators=[RegexValidator(API_KEY_ENV, "an environment variable name ending in _API_KEY, like VLLM_API_KEY")],
    )
    # Token budget of the prompt a run sends (estimated); over it, older tool results
    # are folded into short stubs (docs/models.md). Empty: no budget.
    context_tokens = models.PositiveIntegerField(null=True, blank=True)
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(null=True, blank=True, help_text="tool names offered; empty means all registered")
    denied_tools = models.JSONField(default=list, blank=True)
    always_ask_tools = models.JSONField(default=list, blank=True)
    limits = models.JSONField(default=dict, blank=True, help_text=f"overrides of {sorted(DEFAULTS)}")
    # Policy (docs/policy.md): snapshotted into each run at launch.
    rules = models.JSONField(
        default=list, blank=True,
        help_text='ordered argument rules, first match wins: [{"tool": "refund", "when": {"arg": "amount", '
        '"op": "gt", "value": 100}, "then": "ask", "reason": "refunds over 100 need a human"}]',
    )
    irreversible_approvals = models.PositiveSmallIntegerField(
        default=1, help_text="votes an irreversible call needs when no rule says otherwise"
    )
    separate_duties = models.BooleanField(default=True, help_text="the run's launcher may not approve its calls")
    approval_timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="an approval expires after this long (empty: only the run's deadline)"
    )
    ON_EXPIRY = [(v, v) for v in engine_policy.ON_EXPIRY]
    on_expiry = models.CharField(max_length=10, choices=ON_EXPIRY, default="reject")

    objects = AgentProfileQuerySet.as_manager()

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        try:
            rules = engine_policy.validate_rules(self.rules)
            if isinstance(self.tools, list) and self.tools:  # empty: every registered tool
                engine_policy.check_rule_tools(rules, self.tools)
            engine_policy.validate_settings(self.policy_fields())
        except engine_policy.PolicyError as exc:
            name = exc.field.split("[")[0].split(".")[0]
            raise ValidationError({name: f"{exc.field}: {exc.message}"}) from None

    def policy_fields(self) -> dict[str, Any]:
        """The profile's policy, as `engine.policy.snapshot` takes it."""
        return {
            "rules": self.rules,
            "irreversible_approvals": self.irreversible_approvals,
            "separate_duties": self.separate_duties,
            "approval_timeout_seconds": self.approval_timeout_seconds,
            "on_expiry": self.on_expiry,
        }

    def base_limits(self) -> Limits:
        return Limits.from_dict(self.limits)

    def prices(self) -> dict[str, int]:
        """The run's price snapshot; a cache price left empty is not in it, so the
        engine bills those tokens at the input price."""
        prices = {"input": self.price_input_micros, "output": self.price_output_micros}
        if self.price_cached_input_micros is not None:
            prices["cached_input"] = self.price_cached_input_micros
        if self.price_cache_write_micros is not None:
            prices["cache_write"] = self.price_cache_write_micros
        return prices


class Run(models.Model):
    STATES = [(s, s) for s in states.STATES]
    APPROVERS = [("human", "human"), ("none", "none")]

    profile = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, related_name="runs")
    task = models.TextField()
    # (created_by, -created_at) below serves the foreign key too: every transition
    # rewrites this row, and each index it carries costs a write.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
        db_index=False,
    )
    approver = models.CharField(max_length=10, choices=APPROVERS, default="human")
    script = models.JSONField(null=True, blank=True)

    # The cache of the engine state; replaying the transitions must reproduce it.
    state = models.CharField(max_length=20, choices=STATES, default=states.QUEUED)
    steps = models.PositiveIntegerField(default=0)
    cost_micros = models.PositiveBigIntegerField(default=0)
    cost_unknown = models.BooleanField(default=False)
    tokens = models.PositiveBigIntegerField(default=0)
    tainted = models.BooleanField(default=False)
    answer = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    engine = models.JSONField(default=dict)
    version = models.PositiveIntegerField(default=0)
    messages_count = models.PositiveIntegerField(default=0)

    deadline = models.DateTimeField()
    lease_owner = models.CharField(max_length=100, null=True, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    claims_without_progress = models.PositiveSmallIntegerField(default=0)
    # The W3C traceparent of the run's trace, set at launch when tracing is on: a run
    # resumed on another worker continues the same trace (agents/telemetry.py).
    trace_context = models.CharField(max_length=60, blank=True, default="")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Not a column: True on the run `actions.run_launch` answered from an Idempotency-Key
    # instead of launching (the API's 200 rather than 201).
    replayed: bool = False

    class Meta:
        indexes = [
            models.Index(fields=["-created_at"], name="run_created"),
            models.Index(fields=["state", "-created_at"], name="run_state_created"),
            models.Index(fields=["created_by", "-created_at"], name="run_owner_created"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.state})"

    def cache_tokens(self) -> dict[str, int]:
        """Prompt tokens its model calls read from (`read`) and wrote to (`write`) the
        provider's cache, summed over the transitions' recorded usage in one query."""
        def total(name: str) -> Sum:
            return Sum(Cast(Transition.cache_usage(name), models.BigIntegerField()))

        sums = self.transitions.filter(kind="model").aggregate(**{name: total(name) for name in Transition.CACHE_USAGE})
        return {k: v or 0 for k, v in sums.items()}

    @property
    def is_terminal(self) -> bool:
        return self.state in states.TERMINAL

    @property
    def has_grants(self) -> bool:
        """Whether the run ever granted a call: the engine state lists every grant, revoked
        ones too, and the store writes each Grant row in the commit that adds it there."""
        return bool((self.engine or {}).get("grants"))

    def policy(self) -> dict[str, Any]:
        """The run's policy snapshot, always with all five keys.

        A run launched before policies were snapshotted has none: it keeps the rules it
        was launched with (none) and takes the other fields from its profile.
        """
        snap = (self.engine or {}).get("policy")
        if snap:
            return engine_policy.effective(snap)
        return {**engine_policy.effective(self.profile.policy_fields()), "rules": []}

    def pending_approval(self) -> Approval | None:
        """The approval the run waits on, if any (a run waits on at most one)."""
        return Approval.objects.select_related("decided_by").prefetch_related("votes").filter(run=self).pending().first()

    def to_dict(self) -> RunDict:
        """The run as the JSON API returns it (webhooks and commands send the same)."""
        pending = self.pending_approval()
        return {
            "id": self.pk,
            "agent": self.profile.name,
            "state": self.state,
            "task": self.task,
            "steps": self.steps,
            "cost_micros": self.cost_micros,
            "tokens": self.tokens,
            "answer": self.answer,
            "error": self.error,
            "tainted": self.tainted,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "pending_approval": pending.to_dict() if pending else None,
            "grants": [g.to_dict() for g in self.grants.select_related("by").order_by("number")],
        }


class Transition(models.Model):
    """One row per transition, never updated: the audit trail."""

    # (run, seq) is unique, so that index serves the foreign key too.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="transitions", db_index=False)
    seq = models.PositiveIntegerField()
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20)
    kind = models.CharField(max_length=30)
    payload = models.JSONField(default=dict)
    cost_micros = models.PositiveBigIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)
    actor = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="transition_run_seq")]
        ordering = ["run", "seq"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise RuntimeError("transitions are immutable")
        super().save(*args, **kwargs)

    # The prompt-cache tokens a model call reports in its usage: read from and written
    # to the provider's cache.
    CACHE_USAGE = {"read": "cached_input_tokens", "write": "cache_write_tokens"}

    @classmethod
    def cache_usage(cls, name: str) -> KT:
        """CACHE_USAGE[name] of a (model) transition's recorded usage, as text."""
        return KT(f"payload__usage__{cls.CACHE_USAGE[name]}")


class Message(models.Model):
    """The transcript, stored once as appended deltas."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages", db_index=False)
    index = models.PositiveIntegerField()
    seq = models.PositiveIntegerField(help_text="the transition that appended it (0: launch)")
    role = models.CharField(max_length=20)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True)
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="message_run_index")]
        ordering = ["run", "index"]

    # The columns the engine's message is made of, in `engine_message`'s order.
    ENGINE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")

    @classmethod
    def engine_transcript(cls, run: Run) -> list[dict[str, Any]]:
        """The run's transcript as the engine sees it, read without building models (or
        a queryset: every drive reads it, see agents/rows.py)."""
        order = connection.ops.quote_name("index")
        return [engine_message(*row) for row in _transcript_rows().fetch("run_id = %s", [run.pk], order_by=order)]


@functools.cache
def _transcript_rows() -> rows.Rows:
    return rows.Rows(Message, Message.ENGINE_FIELDS)


def engine_message(role: str, content: str, tool_calls: Any, tool_call_id: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        data["tool_calls"] = tool_calls
    if tool_call_id:
        data["tool_call_id"] = tool_call_id
    if name:
        data["name"] = name
    return data


class ToolCall(models.Model):
    """The journal: one row per idempotency key, the intent before the execution."""

    STATUSES = [(s, s) for s in ("intended", "started", "succeeded", "failed")]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False)
    # Unique through a constraint, not unique=True, which would add a LIKE index nobody uses.
    idempotency_key = models.CharField(max_length=64)
    fingerprint = models.CharField(max_length=32, help_text="tool + canonical args, whatever the step")
    step = models.PositiveIntegerField()
    call_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    args = models.JSONField(null=True)
    status = models.CharField(max_length=10, choices=STATUSES, default="intended")
    result = models.JSONField(null=True, blank=True)
    result_chars = models.PositiveBigIntegerField(default=0)
    result_truncated = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["run", "fingerprint"], name="toolcall_run_fingerprint")]
        constraints = [models.UniqueConstraint(fields=["idempotency_key"], name="toolcall_idempotency_key")]


class ApprovalQuerySet(models.QuerySet["Approval"]):
    def pending(self) -> ApprovalQuerySet:
        return self.filter(status=Approval.Status.PENDING)


class ApprovalDict(TypedDict):
    id: int
    run: int
    status: str
    kind: str
    tool: str
    risk: str
    args: Any
    edited_args: Any
    reason: str
    taint_source: dict[str, Any] | None
    rule: dict[str, Any] | None
    required: int
    votes: list[dict[str, Any]]
    decided_by: str | None
    decided_at: dt.datetime | None
    note: str
    expires_at: dt.datetime | None
    created_at: dt.datetime


class RunDict(TypedDict):
    id: int
    agent: str
    state: str
    task: str
    steps: int
    cost_micros: int
    tokens: int
    answer: str | None
    error: str | None
    tainted: bool
    created_at: dt.datetime
    updated_at: dt.datetime
    pending_approval: ApprovalDict | None
    grants: list[dict[str, Any]]


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

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
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
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["status", "created_at"], name="approval_status_created"),
            # The sweeper's "due" query and the queue's "expires soonest" order.
            models.Index(fields=["expires_at"], condition=models.Q(status=decisions.PENDING), name="approval_pending_expires"),
            # The queue's tool choices, read by skipping from tool to tool (reviews.cards).
            models.Index(fields=["tool"], condition=models.Q(status=decisions.PENDING), name="approval_pending_tool"),
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
    def decided_label(self) -> str:
        return decisions.label(self.decision, self.status)

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

    def current_votes(self) -> list[ApprovalVote]:
        """This round's votes, oldest first (prefetched `votes` are used when present)."""
        return sorted((v for v in self.votes.all() if v.round == self.round), key=lambda v: (v.at, v.pk))

    def grant_refusal(self) -> str | None:
        """Why approving this call may not also grant it for the run, or None."""
        return engine_policy.grant_refusal(
            risk=self.risk, required=self.required, tainted=self.run.tainted, kind=self.kind
        )

    @property
    def rule_label(self) -> str:
        """'rule 2 of the profile' for an approval a rule asked for, else ''."""
        return engine_policy.rule_label(self.rule) if isinstance(self.rule, dict) else ""

    def to_dict(self) -> ApprovalDict:
        """The approval as the JSON API returns it (a run's `pending_approval` too)."""
        return {
            "id": self.pk,
            "run": self.run_id,
            "status": self.status,
            "kind": self.kind,
            "tool": self.tool,
            "risk": self.risk,
            "args": self.args,
            "edited_args": self.edited_args,
            "reason": self.reason,
            "taint_source": self.taint_source,
            "rule": self.rule,
            "required": self.required,
            "votes": [v.to_dict() for v in self.current_votes()],
            "decided_by": self.decided_by.get_username() if self.decided_by else None,
            "decided_at": self.decided_at,
            "note": self.note,
            "expires_at": self.expires_at,
            "created_at": self.created_at,
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
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["approval", "round", "by_name"], name="vote_once_per_round"),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by_name, "decision": self.decision, "note": self.note, "at": self.at}


class Grant(models.Model):
    """A run-scoped grant: a reviewer approved a call and let the same call (`args`
    set) or any call of the tool (`args` null) through for the rest of the run. The
    engine state holds it as grant `number`; this row is the record people read."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="grants", db_index=False)
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "tool": self.tool,
            "args": self.args,
            "by": self.by.get_username() if self.by else None,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


class MetricTally(models.Model):
    """Counters and histogram buckets folded from the append-only transition log.

    `GET /metrics` folds the transitions committed since the last scrape into these
    rows (agents/metrics.py), so the totals cost the hot path nothing and are exact
    whatever process died. The row named `_folded_through` holds the last transition id
    folded, in `total`.
    """

    name = models.CharField(max_length=40)
    labels = models.CharField(max_length=300, blank=True, help_text="label values joined by '|'")
    bucket = models.SmallIntegerField(default=-1, help_text="histogram bucket index; -1 for a counter")
    count = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "labels", "bucket"], name="tally_name_labels_bucket")]


class LedgerEntry(models.Model):
    """Side effects of the diagnostic ledger tools: how tests count executions."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ledger")
    idempotency_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    entry = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)


# -- the JSON API ----------------------------------------------------------------------


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def revoke(self) -> int:
        """Revoke the active tokens among these (the command's and the admin's action);
        returns how many were still active."""
        return self.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


class ApiToken(models.Model):
    """A bearer token for the JSON API. Only its sha256 is stored: a leaked database
    does not leak working tokens, and the token itself is shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False, help_text="the token's first characters, to recognise it")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class IdempotencyKey(models.Model):
    """An `Idempotency-Key` a caller sent with `POST /api/runs`: the same key with the
    same body returns the run it launched instead of launching twice."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    body_hash = models.CharField(max_length=64)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key")]


# -- MCP servers as tool sources ---------------------------------------------------------


def _validate_server_name(value: str) -> None:
    from django.core.exceptions import ValidationError

    from agents.tools.mcp.mapping import server_name_problem

    problem = server_name_problem(value)
    if problem:
        raise ValidationError(problem)


class McpServer(models.Model):
    """An MCP server whose tools Airlock offers as `NAME__tool`.

    Secrets never live here: a stdio environment value written `${VAR}` and every HTTP
    header value are read from the worker's environment variable of that name per call.
    """

    TRANSPORTS = [("stdio", "stdio (a command the worker starts)"), ("http", "streamable HTTP")]

    name = models.CharField(max_length=24, unique=True, validators=[_validate_server_name])
    transport = models.CharField(max_length=10, choices=TRANSPORTS)
    command = models.TextField(blank=True, help_text="stdio: the command line (split like a shell does)")
    url = models.URLField(max_length=500, blank=True, help_text="streamable HTTP: the endpoint")
    env = models.JSONField(
        default=dict, blank=True, help_text='stdio: {"KEY": "value"}; a value "${VAR}" is read from the worker\'s VAR'
    )
    headers = models.JSONField(
        default=dict, blank=True, help_text='HTTP: {"Header-Name": "ENV_VAR"}; the value comes from that variable'
    )
    timeout_seconds = models.FloatField(default=30.0, help_text="per call, connecting included")
    enabled = models.BooleanField(default=True)
    synced_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.transport == "stdio" and (not self.command.strip() or self.url):
            raise ValidationError("a stdio server has a command and no URL")
        if self.transport == "http" and (not self.url or self.command):
            raise ValidationError("a streamable HTTP server has a URL and no command")
        if self.transport == "http" and self.env:
            raise ValidationError("env sets a stdio server's environment; an HTTP server takes headers")
        if self.transport == "stdio" and self.headers:
            raise ValidationError("headers are for HTTP servers")

    def target(self) -> str:
        return self.url if self.transport == "http" else self.command


class McpTool(models.Model):
    """One tool of an MCP server, pinned to the definition an operator accepted.

    The server's annotations are a claim; the `*_override` fields are the operator's
    word and win. A sync that finds a different definition parks it in `pending_*` and
    sets `status` to `changed`: the tool is not offered until someone accepts it.
    """

    STATUSES = [
        ("active", "active"),
        ("changed", "changed: disabled until accepted"),
        ("removed", "removed from the server"),
        ("invalid", "invalid input schema"),
    ]
    RISKS = [(r, r) for r in ("read", "write", "irreversible")]
    RETURNS = [(r, r) for r in ("internal", "external")]
    RETRY = [(r, r) for r in ("safe", "unsafe")]

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    mcp_name = models.CharField(max_length=200, help_text="the name the server uses")
    name = models.CharField(max_length=64, unique=True, help_text="the name the model sees: SERVER__tool")
    name_note = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    sha256 = models.CharField(max_length=64, help_text="of the accepted definition")
    status = models.CharField(max_length=10, choices=STATUSES, default="active")
    pending_definition = models.JSONField(null=True, blank=True, editable=False)
    pending_sha256 = models.CharField(max_length=64, blank=True, editable=False)
    risk_override = models.CharField(max_length=12, choices=RISKS, blank=True)
    returns_override = models.CharField(max_length=10, choices=RETURNS, blank=True)
    retry_safety_override = models.CharField(max_length=6, choices=RETRY, blank=True)
    timeout_seconds = models.FloatField(null=True, blank=True, help_text="empty: the server's")
    enabled = models.BooleanField(default=True, help_text="the operator's switch")
    synced_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["server", "mcp_name"], name="mcp_tool_server_name")]

    def __str__(self) -> str:
        return self.name

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.mcp_name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": self.annotations,
        }

    def claimed(self) -> Any:
        from agents.tools.mcp.mapping import claimed_kind

        return claimed_kind(self.annotations)

    def effective(self) -> Any:
        """The kind Airlock applies: the operator's overrides over the server's claim."""
        from agents.tools.mcp.mapping import Kind

        claim = self.claimed()
        return Kind(
            self.risk_override or claim.risk,
            self.returns_override or claim.returns,
            self.retry_safety_override or claim.retry_safety,
        )

    def offered(self) -> bool:
        return self.status == "active" and self.enabled and self.server.enabled

    def timeout(self) -> float:
        return self.timeout_seconds if self.timeout_seconds is not None else self.server.timeout_seconds


# -- notifications: the outbox, webhooks and their deliveries (issue #14) ---------------

EVENT_TYPES = (
    "approval.pending",
    "approval.decided",
    "approval.expired",
    "approval.expiring",
    "run.done",
    "run.failed",
    "run.cancelled",
)


class Webhook(models.Model):
    """A receiver of events, signed the Standard Webhooks way with its own secret."""

    FORMATS = [("json", "json"), ("slack", "slack")]

    url = models.URLField(max_length=2000, validators=[URLValidator(schemes=["http", "https"])])
    # The HMAC key must be kept to sign with, so it is stored; it is shown once, when
    # `manage.py add_webhook` makes it, and never on a page or in a log.
    secret = models.CharField(max_length=100, editable=False)
    events = models.JSONField(default=list, help_text=f"event types, of {', '.join(EVENT_TYPES)}")
    format = models.CharField(max_length=10, choices=FORMATS, default="json")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"webhook {self.pk} ({self.format}: {', '.join(self.events)})"

    def wants(self, event_type: str) -> bool:
        return self.active and event_type in self.events

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if not isinstance(self.events, list):
            raise ValidationError({"events": "a list of event types"})
        unknown = [e for e in self.events if e not in EVENT_TYPES]
        if unknown:
            raise ValidationError({"events": f"unknown event type(s) {unknown}; known: {', '.join(EVENT_TYPES)}"})


class OutboxEvent(models.Model):
    """An event, written in the same transaction as the transition that caused it.

    `data` is rendered once, by the first dispatcher to see the event (the object as the
    API returns it then), and never again: every retry and every receiver gets the same
    body under the same `msg_id` (the `webhook-id` header).
    """

    msg_id = models.CharField(max_length=40)
    type = models.CharField(max_length=30)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    approval = models.ForeignKey(Approval, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="rendered and fanned out to webhooks")
    emailed_at = models.DateTimeField(null=True, blank=True, help_text="included in a reviewers' digest")

    class Meta:
        indexes = [
            # What the dispatcher and the digest look for: small, the rest is history.
            models.Index(fields=["id"], condition=models.Q(dispatched_at__isnull=True), name="outbox_undispatched"),
            models.Index(
                fields=["created_at"],
                condition=models.Q(type="approval.pending", emailed_at__isnull=True),
                name="outbox_unemailed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.msg_id}"


class Delivery(models.Model):
    """One event to one webhook: at least once, retried with back-off, then dead."""

    STATUSES = [(s, s) for s in ("pending", "delivered", "dead")]

    event = models.ForeignKey(OutboxEvent, on_delete=models.CASCADE, related_name="deliveries")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=STATUSES, default="pending")
    attempts = models.PositiveIntegerField(default=0)
    # Due when in the past; a claimed attempt pushes it past its timeout, so a worker
    # that dies mid-attempt leaves it due again (at least once, same webhook-id).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["event", "webhook"], name="delivery_event_webhook")]
        indexes = [
            models.Index(
                fields=["next_attempt_at"], condition=models.Q(status="pending"), name="delivery_pending_due"
            )
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} ({self.status})"


class DeliveryAttempt(models.Model):
    """Every attempt, recorded before the request goes out: one without `finished_at`
    is an attempt whose worker died mid-request."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["delivery", "number"]


class NotificationPreference(models.Model):
    """A reviewer's choice about the pending-calls email digest (default: on)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference")
    email_digest = models.BooleanField(default=True, help_text="email me digests of tool calls waiting for review")

    def __str__(self) -> str:
        return f"{self.user}: digest {'on' if self.email_digest else 'off'}"

    @classmethod
    def digest_on(cls, user: Any) -> bool:
        return not cls.objects.filter(user=user, email_digest=False).exists()

    @classmethod
    def set_digest(cls, user: Any, on: bool) -> None:
        cls.objects.update_or_create(user=user, defaults={"email_digest": on})
