"""The ledger of runs: profiles, runs, immutable transitions, the transcript, the
tool-call journal, approvals and the diagnostic side-effect ledger."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.limits import DEFAULTS, Limits
from agents.llm import API_KEY_ENV


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

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        try:
            engine_policy.validate_rules(self.rules)
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
        def total(key: str) -> Sum:
            return Sum(Cast(KT(f"payload__usage__{key}"), models.BigIntegerField()))

        sums = self.transitions.filter(kind="model").aggregate(
            read=total("cached_input_tokens"), write=total("cache_write_tokens")
        )
        return {k: v or 0 for k, v in sums.items()}

    @property
    def is_terminal(self) -> bool:
        return self.state in states.TERMINAL

    def policy(self) -> dict[str, Any]:
        """The run's policy snapshot, always with all five keys.

        A run launched before policies were snapshotted has none: it keeps the rules it
        was launched with (none) and takes the other fields from its profile.
        """
        snap = (self.engine or {}).get("policy")
        if snap:
            return engine_policy.effective(snap)
        return {**engine_policy.effective(self.profile.policy_fields()), "rules": []}


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

    def to_engine(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            data["tool_call_id"] = self.tool_call_id
        if self.name:
            data["name"] = self.name
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


class Approval(models.Model):
    STATUSES = [(s, s) for s in ("pending", "approved", "rejected", "expired", "denied")]
    KINDS = [("policy", "policy"), ("outcome_unknown", "outcome unknown")]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(max_length=20, choices=KINDS, default="policy")
    idempotency_key = models.CharField(max_length=64)
    call_id = models.CharField(max_length=200)
    step = models.PositiveIntegerField(default=0)
    tool = models.CharField(max_length=100)
    args = models.JSONField(null=True)
    risk = models.CharField(max_length=20)
    reason = models.TextField()
    taint_source = models.JSONField(null=True, blank=True)
    rule = models.JSONField(null=True, blank=True, help_text="the rule that asked (with origin and index), or null")
    required = models.PositiveSmallIntegerField(default=1, help_text="votes needed")
    status = models.CharField(max_length=10, choices=STATUSES, default="pending")
    decision = models.CharField(max_length=10, blank=True, help_text="approve, reject, happened, retry or fail")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["status", "created_at"], name="approval_status_created")]
        constraints = [
            # At most one open question per run: the engine waits on one call at a time.
            models.UniqueConstraint(
                fields=["run"], condition=models.Q(status="pending"), name="approval_one_pending_per_run"
            )
        ]

    def grant_refusal(self) -> str | None:
        """Why approving this call may not also grant it for the run, or None."""
        return engine_policy.grant_refusal(
            risk=self.risk, required=self.required, tainted=self.run.tainted, kind=self.kind
        )

    @property
    def rule_label(self) -> str:
        """'rule 2 of the profile' for an approval a rule asked for, else ''."""
        return engine_policy.rule_label(self.rule) if isinstance(self.rule, dict) else ""


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
