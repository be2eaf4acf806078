"""A run and what it is made of: agent profiles, runs, immutable transitions, the
transcript (message rows) and the tool-call journal."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Collection
from typing import Annotated, Any, TypedDict

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import connection, models
from django.db.models import Prefetch, Sum, prefetch_related_objects
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from pydantic import Field

from agents.engine import limits as engine_limits
from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.limits import DEFAULTS, Limits
from agents.engine.registry import PATTERN, ClientToolError, ToolSpec, client_tool_specs
from agents.lib import rows
from agents.lib.keys import API_KEY_ENV
from agents.models.approvals import Approval, ApprovalDict, Grant, GrantDict
from agents.models.fields import URLField
from agents.models.projects import default_project

# Which tool names exist: agents.tools knows (the built-in and diagnostic tools, the
# MCP servers' pinned ones), and the tools import these models to run, so the models
# cannot import them back. AgentsConfig.ready() hands these over at start; before that
# (a migration's historical model) tool names are checked for their shape only.
# unknown_tools(names): the names and `SERVER__*` patterns among `names` that name no
# tool or server; local_tool_names(): the names that need no server, for the message.
unknown_tools: Callable[[list[str]], list[str]] | None = None
local_tool_names: Callable[[], list[str]] | None = None

TOOL_LISTS = ("tools", "denied_tools", "always_ask_tools")


def tool_list_problem(value: Any, *, nullable: bool = False, own: Collection[str] = ()) -> str | None:
    """What is wrong with a profile's list of tool names or `SERVER__*` patterns, or
    None: a list of known names (an unknown one could never be offered, denied or
    asked about, silently), each once. `own`: the profile's client tools' names."""
    if value is None:
        return None if nullable else "a list of tool names: write [] for none"
    if not isinstance(value, list) or not all(isinstance(n, str) and n.strip() for n in value):
        return f'a list of tool names, like ["kb_search", "SERVER__*"], not {value!r}'
    asked = [n for n in value if n not in own]
    unknown = unknown_tools(asked) if unknown_tools is not None and asked else []
    if unknown:
        shown = ", ".join(sorted(local_tool_names())) if local_tool_names is not None else ""
        named = ", ".join(map(repr, unknown))
        return f"no tool named {named} (tools: {shown}; an MCP server's: SERVER__tool or SERVER__*)"
    if len(set(value)) != len(value):
        return f"{sorted({n for n in value if value.count(n) > 1})[0]!r} is listed twice"
    return None

# An MCP tool's name is `SERVER__tool` (agents/lib/mcp_mapping.py: SEPARATOR).
MCP_SEPARATOR = PATTERN[:-1]


class AgentProfileQuerySet(models.QuerySet["AgentProfile"]):
    def launchable(self) -> AgentProfileQuerySet:
        """The profiles a launch may offer, by name: scripted ones only while
        AIRLOCK_ALLOW_SCRIPTED is on."""
        profiles = self.order_by("name")
        if not settings.AIRLOCK_ALLOW_SCRIPTED:
            profiles = profiles.exclude(provider="scripted")
        return profiles


class AgentProfile(models.Model):
    # "external": the run's decisions come from a client through the decision API
    # (agents/actions/external.py), not from a model Airlock calls.
    PROVIDERS = [(p, p) for p in ("scripted", "demo", "openai", "anthropic", "external")]

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
    base_url = URLField(max_length=500, blank=True)
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
    # An external profile's tools that run in the client's process (docs/gateway.md).
    client_tools = models.JSONField(
        default=list, blank=True,
        help_text='external profiles: tools the client runs, [{"name", "description", "schema", "risk", '
        '"returns", "retry_safety"}] with the values built-in tools declare',
    )
    # The MCP gateway (docs/gateway.md, "One server's own names"): a profile whose tools are
    # one MCP server's lists them under the server's own names, so a client's prompts and
    # docs written for that server keep working; calls are governed as `SERVER__tool`.
    expose_names = models.BooleanField(
        default=False,
        help_text="external profiles whose tools are one MCP server's (SERVER__* or SERVER__tool entries only): "
        "the MCP gateway lists them under the server's own names, without the SERVER__ prefix",
    )
    # Retention (docs/operations.md): empty means AIRLOCK_RETENTION_DAYS (unset: keep all).
    retention_days = models.PositiveIntegerField(
        null=True, blank=True, help_text="purge finished runs' content after this many days (empty: the deployment's)"
    )
    hold_reason = models.CharField(
        max_length=500, blank=True, db_default="", help_text="a legal hold on every run of this profile: never purged while set"
    )
    # Teams (docs/teams.md): the project owns the profile and its runs.
    project = models.ForeignKey(
        "agents.Project", on_delete=models.PROTECT, related_name="profiles", default=default_project
    )
    # Who reviews (docs/reviewing.md): empty means the `reviewer` group.
    reviewer_group = models.CharField(
        max_length=150, blank=True, default="",
        help_text="the Django group whose members see and decide this profile's calls (empty: the reviewer group); "
        "superusers always may",
    )
    backup_group = models.CharField(
        max_length=150, blank=True, default="",
        help_text="the Django group that may also see and decide a call once it is escalated, and is told then",
    )
    escalate_after_seconds = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="escalate a call still pending this many seconds after it was asked to the backup group "
        "(empty: never)",
    )

    objects = AgentProfileQuerySet.as_manager()

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        self._clean_reviewing()
        errors = self.problems()
        if errors:
            raise ValidationError(errors)
        # Saved as validated: each reason one line, capped (it reaches notifications).
        self.rules = engine_policy.validate_rules(self.rules)

    def problems(self, *, launch: bool = False) -> dict[str, str]:
        """What keeps this profile from launching, by field, in the launch API's words:
        its limits, its tool lists, its rules and policy, its client tools. Empty for a
        sound profile. The admin refuses to save these (clean()); a row broken anyway
        (an old one, a raw update) is shown unavailable on the launch form, refused by
        a launch naming the field, and listed by `manage.py check`. `launch`: only what
        stops a launch (a rule for a tool the profile does not offer never matches; it
        is refused on save and listed by the check, and harms no run)."""
        errors: dict[str, str] = {}
        try:
            engine_limits.of_profile(self.limits)
        except engine_limits.LimitError as exc:
            errors["limits"] = str(exc)
        try:
            own = [spec.name for spec in self.client_specs()]
        except ValidationError as exc:
            errors["client_tools"] = "; ".join(exc.messages)
            own = []
        for field in TOOL_LISTS:
            problem = tool_list_problem(getattr(self, field), nullable=field == "tools", own=own)
            if problem:
                errors[field] = problem
        try:
            rules = engine_policy.validate_rules(self.rules)
            if not launch and "tools" not in errors and self.tools:  # empty: every registered tool
                engine_policy.check_rule_tools(rules, self.tools)
            engine_policy.validate_settings(self.policy_fields())
        except engine_policy.PolicyError as exc:
            name = exc.field.split("[")[0].split(".")[0]
            errors.setdefault(name, f"{exc.field}: {exc.message}")
        if self.expose_names and (problem := self._exposed_problem()):
            errors["expose_names"] = problem
        return errors

    def launch_problem(self) -> str | None:
        """Why this profile cannot launch now, naming its first broken field; or None."""
        errors = self.problems(launch=True)
        if not errors:
            return None
        field, message = next(iter(errors.items()))
        return f"the agent profile {self.name!r} is misconfigured: its {field}: {message} (fix it in the admin)"

    def _exposed_problem(self) -> str | None:
        """`expose_names` needs an external profile whose tools are one MCP server's:
        with two servers (or a built-in tool beside them) two tools could share a name."""
        if self.provider != "external":
            return "only an external profile's tools are offered through the gateway"
        if self.exposed_server() is None:
            return "the profile's tools must all be one MCP server's (SERVER__* or SERVER__tool entries, one SERVER)"
        return None

    def exposed_server(self) -> str | None:
        """The MCP server whose own names the gateway lists: set when `expose_names` is
        on and every entry of `tools` is that one server's (`SERVER__*`, `SERVER__tool`)."""
        if not self.expose_names or not isinstance(self.tools, list) or not self.tools:
            return None
        servers = {str(t).split(MCP_SEPARATOR, 1)[0] if MCP_SEPARATOR in str(t) else "" for t in self.tools}
        if len(servers) != 1 or "" in servers:
            return None
        return servers.pop()

    def _clean_reviewing(self) -> None:
        """Who reviews: groups that exist (a misspelt group would leave the calls to
        superusers alone, silently), and an escalation that has somewhere to go."""
        errors: dict[str, str] = {}
        for field in ("reviewer_group", "backup_group"):
            name = getattr(self, field).strip()
            setattr(self, field, name)
            if name and not Group.objects.filter(name=name).exists():
                errors[field] = f"there is no group named {name!r}: create it first (Groups, in the admin)"
        if self.escalate_after_seconds is not None:
            if self.escalate_after_seconds < 1:
                errors["escalate_after_seconds"] = "at least 1 second, or empty for never"
            elif not self.backup_group and "backup_group" not in errors:
                errors["escalate_after_seconds"] = "an escalation needs a backup group to go to"
        if errors:
            raise ValidationError(errors)

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Client tools are checked on every save, not only in the admin's form: a
        # profile written by a script or a migration with a broken tool would make
        # each of its runs fail at its first proposal instead.
        self.client_specs()
        super().save(*args, **kwargs)

    def tool_names(self) -> list[str] | None:
        """The tool names and `NAME__*` patterns the profile offers; None for every
        registered tool (what an empty list means)."""
        return list(self.tools) if self.tools else None

    def client_specs(self) -> list[ToolSpec]:
        """The profile's client tools as specs; ValidationError naming the bad entry.
        Only an external profile may declare any."""
        if self.client_tools and self.provider != "external":
            raise ValidationError({"client_tools": "only an external profile has client tools"})
        try:
            return client_tool_specs(self.client_tools)
        except ClientToolError as exc:
            raise ValidationError({"client_tools": str(exc)}) from None

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
        """The profile's limits; LimitError for a broken row (launch_problem() says why first)."""
        return engine_limits.of_profile(self.limits)

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
    APPROVERS = [(a, a) for a in engine_policy.APPROVERS]

    profile = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, related_name="runs")
    task = models.TextField()
    # (created_by, -created_at) below serves the foreign key too: every transition
    # rewrites this row, and each index it carries costs a write.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
        db_index=False,
    )
    approver = models.CharField(max_length=10, choices=APPROVERS, default=engine_policy.HUMAN)
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
    # resumed on another worker continues the same trace (agents/ops/telemetry.py).
    trace_context = models.CharField(max_length=60, blank=True, default="")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Retention (agents/runs/retention.py): a purged run is a tombstone; a held one is
    # never purged.
    purged_at = models.DateTimeField(null=True, blank=True)
    purge_retention_days = models.PositiveIntegerField(null=True, blank=True)
    # db_default: the one-statement commit (agents/runs/statement.py) writes rows with
    # its own column list, so new columns must default in the database.
    hold_reason = models.CharField(max_length=500, blank=True, db_default="")
    held_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    held_at = models.DateTimeField(null=True, blank=True)
    # A fork (docs/retry.md): the run it was forked from and the transition it starts after.
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks", db_index=False
    )  # indexed where set only (Meta): most runs are no fork
    fork_seq = models.PositiveIntegerField(null=True, blank=True)
    # A gateway stream's run that continues the stream's previous one (docs/gateway.md,
    # "Streams"): the timeline links both ways (`continued_by`).
    continues = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="continued_by", db_index=False
    )  # indexed where set only (Meta)

    # Not a column: True on the run `actions.run_launch` answered from an Idempotency-Key
    # instead of launching (the API's 200 rather than 201).
    replayed: bool = False

    class Meta:
        indexes = [
            models.Index(fields=["-created_at"], name="run_created"),
            models.Index(fields=["forked_from"], condition=models.Q(forked_from__isnull=False), name="run_forks"),
            models.Index(fields=["continues"], condition=models.Q(continues__isnull=False), name="run_continues"),
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
        """The approval the run waits on, if any (a run waits on at most one); the one
        `prefetch_dicts` read, when it did."""
        if hasattr(self, "_pending_approval"):
            return self._pending_approval  # type: ignore[no-any-return]
        return Approval.objects.select_related("decided_by").prefetch_related("votes").filter(run=self).pending().first()

    @staticmethod
    def prefetch_dicts(runs: list[Run]) -> None:
        """Read what to_dict() needs of many runs in three queries instead of two a run
        (the API's lists and export): their pending approvals, with votes and who
        decided, and their grants."""
        pending = Approval.objects.filter(run_id__in=[r.pk for r in runs]).pending()
        by_run = {a.run_id: a for a in pending.select_related("decided_by").prefetch_related("votes")}
        for run in runs:
            run._pending_approval = by_run.get(run.pk)  # type: ignore[attr-defined]
        prefetch_related_objects(runs, Prefetch("grants", Grant.objects.select_related("by").order_by("number")))

    def _grants(self) -> Any:
        if getattr(self, "_grant_count", None) == 0:
            return []  # access.readable_run(for_dict=True) counted them with the run
        if "grants" in getattr(self, "_prefetched_objects_cache", {}):
            return self.grants.all()  # prefetch_dicts read them in order
        return self.grants.select_related("by").order_by("number")

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
            "grants": [g.to_dict() for g in self._grants()],
            "purged_at": self.purged_at,
            "hold": self.hold(),
            "forked_from": {"run": self.forked_from_id, "seq": self.fork_seq} if self.fork_seq is not None else None,
            "continues": self.continues_id,
        }

    def hold(self) -> dict[str, Any] | None:
        """The legal hold that keeps this run from being purged: its own, or its
        profile's (`scope` says which), or None."""
        if self.hold_reason:
            by = self.held_by.get_username() if self.held_by_id and self.held_by else None
            return {"scope": "run", "reason": self.hold_reason, "by": by, "at": self.held_at}
        if self.profile.hold_reason:
            return {"scope": "profile", "reason": self.profile.hold_reason, "by": None, "at": None}
        return None


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
        a queryset: every drive reads it, see agents/lib/rows.py)."""
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
    # Set when the run is purged (args and result are then null): what they were, by hash.
    args_sha256 = models.CharField(max_length=64, blank=True, db_default="")
    result_sha256 = models.CharField(max_length=64, blank=True, db_default="")

    class Meta:
        indexes = [
            models.Index(fields=["run", "fingerprint"], name="toolcall_run_fingerprint"),
            # History rules (agents/runs/history.py): a tool's calls in a window. On
            # PostgreSQL a GIN index on args (migration 0034) finds a `same` value.
            models.Index(fields=["tool", "created_at"], name="toolcall_tool_created"),
        ]
        constraints = [models.UniqueConstraint(fields=["idempotency_key"], name="toolcall_idempotency_key")]


class RunDict(TypedDict):
    """A run as the API, webhooks, exports and commands give it: the one definition of
    its shape, as ApprovalDict is an approval's (agents/models/approvals.py says how
    agents/api/schemas.py derives the OpenAPI schema, RunOut, from it)."""

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
    grants: Annotated[list[GrantDict], Field([])]
    purged_at: dt.datetime | None
    hold: dict[str, Any] | None
    forked_from: Annotated[dict[str, Any] | None, Field(
        description="a fork's parent run and the transition it starts after"
    )]
    continues: Annotated[int | None, Field(description="the run of the same MCP gateway stream this one continues")]
