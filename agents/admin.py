"""Admin registrations: agent profiles (their policy included), API tokens (created
here or by command, the token shown once; revocable here), MCP servers and their tools
(sync, overrides next to the server's annotations, accepting a changed definition: operators
may do both), webhooks (created here or by command, the secret shown once) and their
deliveries (every attempt; dead ones resent here), notification preferences, projects
and their members. Project admins (the `admin` role) manage their projects' profiles,
webhooks and members here, and see no other project's (ProjectScoped)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.html import format_html

from agents import access
from agents.actions.tokens import token_issue
from agents.engine.policy import PolicyError
from agents.lib import jsonsafe
from agents.models import (
    EVENT_TYPES,
    AgentProfile,
    ApiToken,
    Delivery,
    DeliveryAttempt,
    McpServer,
    McpTool,
    Membership,
    NotificationPreference,
    Project,
    PurgeRecord,
    SlackAction,
    Webhook,
)
from agents.notifications import delivery as notify
from agents.runs import backtest as backtests
from agents.tools.http import UrlRefused
from agents.tools.mcp import McpError, definition_diff, mcp_server_sync, mcp_tool_accept
from agents.web.forms import SafeJSONField

# Every JSON box of the admin parses through agents.lib.jsonsafe (agents.web.forms.SafeJSONField).
SAFE_JSON = {models.JSONField: {"form_class": SafeJSONField}}


def _shown_once(request: HttpRequest, model_admin: admin.ModelAdmin, obj: Any, what: str, value: str,
                how: str) -> TemplateResponse:
    """The page that shows a new secret, the only time it is shown: rendered as the
    answer to the add form's POST, not a redirect, so the value never goes through the
    session, a message cookie or a URL; `no-store` keeps it out of the browser's cache."""
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "title": f"{what} created",
        "obj": obj,
        "what": what,
        "value": value,
        "how": how,
    }
    response = TemplateResponse(request, "admin/agents/shown_once.html", context)
    response["Cache-Control"] = "no-store"
    return response


class ProjectScoped(admin.ModelAdmin):
    """Rows that belong to a project (`project_path` leads from the row to it): a
    superuser manages them all, a project admin those of their projects and may put a
    row only in one of those; everyone else as their model permissions say."""

    project_path = "project"

    def _project_of(self, obj: Any) -> int | None:
        for part in self.project_path.split("__"):
            obj = getattr(obj, part, None)
        return getattr(obj, "pk", None)

    def _administers(self, request: HttpRequest, obj: Any = None) -> bool:
        ids = access.admin_projects(request.user)
        if ids is None:
            return True
        if obj is None:
            return bool(ids)
        return self._project_of(obj) in ids

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request)
        ids = access.admin_projects(request.user)
        if ids is None or request.user.has_perm(f"{self.opts.app_label}.view_{self.opts.model_name}"):
            return rows
        return rows.filter(**{f"{self.project_path}__in": ids})

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or self._administers(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self._administers(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) or self._administers(request, obj)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return super().has_add_permission(request, *args) or self._administers(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) or self._administers(request, obj)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        ids = access.admin_projects(request.user)
        if db_field.name == "project" and ids is not None:
            # A project admin puts rows in their own projects, and always in one.
            kwargs["queryset"] = Project.objects.filter(pk__in=ids).order_by("slug")
            kwargs["required"] = True
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]

    def _administers(self, request: HttpRequest, obj: Any) -> bool:
        ids = access.admin_projects(request.user)
        return ids is None or (obj is not None and obj.pk in ids)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._administers(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._administers(request, obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._administers(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._administers(request, obj)


@admin.register(Project)
class ProjectAdmin(ProjectScoped):
    """A project and its members (roles: reviewer, operator, launcher, admin). Only
    superusers make or delete projects; a project admin renames theirs and manages its
    members."""

    project_path = "pk"
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def _project_of(self, obj: Any) -> int | None:
        return getattr(obj, "pk", None)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = admin.ModelAdmin.get_queryset(self, request)
        ids = access.admin_projects(request.user)
        return rows if ids is None else rows.filter(pk__in=ids)

    def get_readonly_fields(self, request: HttpRequest, obj: Project | None = None) -> list[str]:
        # Pages and tokens name the project by its slug: fixed once made.
        return ["slug"] if obj is not None else []

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(Membership)
class MembershipAdmin(ProjectScoped):
    list_display = ["user", "role", "project", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]


@admin.register(AgentProfile)
class AgentProfileAdmin(ProjectScoped):
    """Rules and client tools are validated on save by `AgentProfile.clean()`; an error
    names the rule or tool and the field (`rules[2].when.op: ...`, `client_tools[0].risk
    ...`). Runs keep the policy they launched with."""

    formfield_overrides = SAFE_JSON

    list_display = ["name", "project", "provider", "model_name", "separate_duties", "irreversible_approvals"]
    list_filter = ["project"]
    search_fields = ["name", "description"]
    fieldsets = [
        (None, {"fields": ["name", "project", "description", "provider", "model_name", "system_prompt"]}),
        ("Model endpoint", {"fields": ["base_url", "api_key_env", "context_tokens"]}),
        ("Tools", {"fields": ["tools", "denied_tools", "always_ask_tools", "client_tools", "expose_names"]}),
        ("Policy", {
            "fields": ["rules", "irreversible_approvals", "separate_duties", "approval_timeout_seconds", "on_expiry"],
            "description": "Argument rules, first match wins; see docs/policy.md.",
        }),
        ("Reviewing", {
            "fields": ["reviewer_group", "backup_group", "escalate_after_seconds"],
            "description": "Who sees and decides this profile's calls (empty: its project's reviewers), and "
            "where a call goes when nobody answers; group names must exist. See docs/reviewing.md and docs/teams.md.",
        }),
        ("Budget", {"fields": [
            "limits", "price_input_micros", "price_output_micros", "price_cached_input_micros", "price_cache_write_micros",
        ]}),
        ("Retention", {
            "fields": ["retention_days", "hold_reason"],
            "description": "Finished runs' content is purged after the retention; a hold keeps every run. See docs/operations.md.",
        }),
    ]

    def get_urls(self) -> list[Any]:
        return [
            path("<path:object_id>/backtest/", self.admin_site.admin_view(self.backtest_view), name="agents_agentprofile_backtest"),
            *super().get_urls(),
        ]

    def backtest_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """"Try these rules": the backtest of a proposed policy over the profile's recent
        calls, and each shadow rule's agreement with what happened. Reads only."""
        profile = self.get_object(request, object_id)
        if profile is None:
            raise Http404("no such agent profile")
        if not self.has_view_permission(request, profile):
            raise PermissionDenied
        initial = {
            "policy": {"rules": profile.rules, "always_ask_tools": profile.always_ask_tools,
                       "denied_tools": profile.denied_tools, "irreversible_approvals": profile.irreversible_approvals},
            "days": backtests.DEFAULT_DAYS,
        }
        offered = _offered_policy(request)
        if offered is not None:
            # A draft offered elsewhere (the review stats' approval fatigue): the form
            # opens on it; only a POST of the form runs the backtest.
            initial["policy"] = offered
        form = TryRulesForm(request.POST or None, initial=initial)
        report = None
        if request.method == "POST" and form.is_valid():
            try:
                report = backtests.backtest(profile, form.cleaned_data["policy"], days=form.cleaned_data["days"])
            except PolicyError as exc:
                form.add_error("policy", str(exc))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Try these rules on {profile.name}",
            "obj": profile,
            "form": form,
            "report": report,
            "rows": [
                {"cls": cls, "summary": report.summary(cls), "changes": report.changes[cls]}
                for cls in backtests.CLASSES if report.changes.get(cls)
            ] if report else [],
            "agreement": backtests.shadow_agreement(profile, days=backtests.DEFAULT_DAYS),
        }
        return TemplateResponse(request, "admin/agents/agentprofile/backtest.html", context)


def _offered_policy(request: HttpRequest) -> dict[str, Any] | None:
    """`?policy=<JSON object>` on a GET of "Try these rules", or None (bad JSON is ignored:
    the form then opens on the profile's own policy)."""
    raw = request.GET.get("policy", "") if request.method == "GET" else ""
    try:
        offered = jsonsafe.parse(raw) if raw else None
    except jsonsafe.JsonError:
        return None
    return offered if isinstance(offered, dict) else None


class TryRulesForm(forms.Form):
    policy = SafeJSONField(
        help_text='{"rules": [...], "always_ask_tools"?, "denied_tools"?, "irreversible_approvals"?}: '
        "the profile's policy fields to try; nothing is saved",
        widget=forms.Textarea(attrs={"rows": 14, "cols": 100}),
    )
    days = forms.IntegerField(min_value=1, max_value=backtests.MAX_DAYS, initial=backtests.DEFAULT_DAYS)


@admin.register(PurgeRecord)
class PurgeRecordAdmin(admin.ModelAdmin):
    """The purges' audit trail: read-only, and never any content of the runs."""

    list_display = ["started_at", "actor", "older_than_days", "agent", "runs", "bytes", "finished_at"]
    readonly_fields = [f.name for f in PurgeRecord._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Adding a token shows it once, on the page that answers the form (as
    `create_api_token` prints it once); only its sha256 is stored."""

    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["user__username", "name", "prefix"]
    readonly_fields = ["user", "project", "prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["user", "name", "project", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        # A project limits the token to it (docs/teams.md); none: all the user's projects.
        return list(self.fields) if obj is not None else ["user", "name", "project"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        return list(self.readonly_fields) if obj is not None else []

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            # As the command refuses one: a token of an inactive user would never work.
            kwargs["queryset"] = get_user_model().objects.filter(is_active=True).order_by("username")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if not change:
            # Kept on this request's object only, for response_add; never saved.
            obj._raw = token_issue(obj)  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        raw = getattr(obj, "_raw", None)
        if raw is None or "_popup" in request.POST:
            return super().response_add(request, obj, post_url_continue)
        return _shown_once(request, self, obj, "API token", raw,
                           "Send it as 'Authorization: Bearer <token>'. Only its sha256 is stored.")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = queryset.revoke()
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


# -- MCP -------------------------------------------------------------------------------


class McpToolInline(admin.TabularInline):
    model = McpTool
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["name", "status", "annotated", "in_effect", "enabled"]
    readonly_fields = ["name", "status", "annotated", "in_effect"]

    def has_add_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return False  # tools come from a sync

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpTool]:
        # A sync pins at most AIRLOCK_MCP_MAX_TOOLS; removed ones (also those past the
        # limit, pinned before there was one) stay listed under MCP tools, not here,
        # so the server's page stays small enough to save.
        return super().get_queryset(request).exclude(status="removed")

    @admin.display(description="annotations say")
    def annotated(self, tool: McpTool) -> str:
        return _kind(tool.annotated())

    @admin.display(description="in effect")
    def in_effect(self, tool: McpTool) -> str:
        return _kind(tool.effective())


def _kind(kind: object) -> str:
    return f"{kind.risk}, {kind.returns}, {kind.retry_safety}"  # type: ignore[attr-defined]


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    formfield_overrides = SAFE_JSON
    list_display = ["name", "transport", "target", "enabled", "synced_at", "last_error"]
    readonly_fields = ["synced_at", "last_error", "created_at"]
    inlines = [McpToolInline]
    actions = ["sync"]

    def get_readonly_fields(self, request: HttpRequest, obj: McpServer | None = None) -> list[str]:
        # The name prefixes its tools' names, which runs and profiles refer to.
        return [*self.readonly_fields, "name"] if obj is not None else list(self.readonly_fields)

    @admin.action(description="Sync tools from the selected servers")
    def sync(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            try:
                lines = mcp_server_sync(server=server)
            except McpError as exc:
                self.message_user(request, f"{server.name}: {exc}", messages.ERROR)
                continue
            changed = [line.name for line in lines if line.status == "changed"]
            level = messages.WARNING if changed else messages.SUCCESS
            text = f"Synced {len(lines)} tool(s) of {server.name}."
            if changed:
                text += f" Changed, disabled until accepted: {', '.join(changed)}."
            invalid = [line.name for line in lines if line.status == "invalid"]
            if invalid:
                level = messages.WARNING
                text += f" Not offered, their input schema is refused: {', '.join(invalid)}."
            for note in lines.notes:
                level = messages.WARNING
                text += f" {note}."
            self.message_user(request, text, level)


@admin.register(McpTool)
class McpToolAdmin(admin.ModelAdmin):
    formfield_overrides = SAFE_JSON
    list_display = ["name", "server", "status", "annotated_risk", "risk_override", "annotated_returns",
                    "returns_override", "annotated_retry", "retry_safety_override", "enabled"]
    list_filter = ["status", "server", "enabled"]
    search_fields = ["name", "mcp_name"]
    readonly_fields = ["server", "mcp_name", "name", "name_note", "status", "description", "input_schema",
                       "annotations", "sha256", "annotated_kind", "synced_at", "pending_diff"]
    fieldsets = [
        (None, {"fields": ["server", "mcp_name", "name", "name_note", "status", "enabled", "timeout_seconds"]}),
        ("The server's definition (pinned)", {"fields": ["description", "input_schema", "annotations", "sha256",
                                                         "synced_at"]}),
        ("Kind: the server's annotations and the operator's overrides", {
            "description": "Annotations are hints from a server that may lie. Only an override makes a tool "
                           "less guarded; an empty override applies the annotations.",
            "fields": ["annotated_kind", "risk_override", "returns_override", "retry_safety_override"],
        }),
        ("Changed definition, waiting for acceptance", {"fields": ["pending_diff"]}),
    ]
    actions = ["accept"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tools come from a sync

    @admin.display(description="risk annotated")
    def annotated_risk(self, tool: McpTool) -> str:
        return str(tool.annotated().risk)

    @admin.display(description="returns annotated")
    def annotated_returns(self, tool: McpTool) -> str:
        return str(tool.annotated().returns)

    @admin.display(description="retry annotated")
    def annotated_retry(self, tool: McpTool) -> str:
        return str(tool.annotated().retry_safety)

    @admin.display(description="the annotations say")
    def annotated_kind(self, tool: McpTool) -> str:
        return _kind(tool.annotated())

    @admin.display(description="difference")
    def pending_diff(self, tool: McpTool) -> str:
        diff = definition_diff(tool)
        if not diff:
            return "none"
        return format_html('<pre class="mcp-diff">{}</pre>', diff)

    # Only who may change a tool may accept its definition (operators: see agents/defaults.py).
    @admin.action(description="Accept the new definition of the selected tools", permissions=["change"])
    def accept(self, request: HttpRequest, queryset: QuerySet[McpTool]) -> None:
        for tool in queryset:
            try:
                mcp_tool_accept(tool_id=tool.pk)
            except McpError as exc:
                self.message_user(request, str(exc), messages.WARNING)
            else:
                self.message_user(request, f"Accepted the new definition of {tool.name}.", messages.SUCCESS)


# -- notifications: webhooks, their deliveries and every attempt ----------


def _redacted(url: str) -> str:
    # A webhook URL can itself be a secret (Slack's are): show where, not the path.
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/…" if rest else url


class WebhookForm(forms.ModelForm):
    # The events as boxes to tick instead of a JSON list to type.
    events = forms.MultipleChoiceField(choices=[(e, e) for e in EVENT_TYPES], widget=forms.CheckboxSelectMultiple)

    class Meta:
        model = Webhook
        fields = ["url", "events", "format", "active", "project"]


@admin.register(Webhook)
class WebhookAdmin(ProjectScoped):
    """Adding a webhook shows its signing secret once, on the page that answers the
    form (as `add_webhook` prints it once). The change page never shows the secret or
    the URL's path (it can be a secret itself)."""

    form = WebhookForm
    formfield_overrides = SAFE_JSON
    list_display = ["pk", "where", "project", "format", "event_list", "active", "created_at"]
    list_filter = ["active", "format", "project"]
    fields = ["where", "project", "events", "format", "active", "created_at"]
    readonly_fields = ["where", "created_at"]

    def get_fields(self, request: HttpRequest, obj: Webhook | None = None) -> list[str]:
        return list(self.fields) if obj is not None else ["url", "project", "events", "format", "active"]

    def get_readonly_fields(self, request: HttpRequest, obj: Webhook | None = None) -> list[str]:
        return list(self.readonly_fields) if obj is not None else []

    def save_model(self, request: HttpRequest, obj: Webhook, form: Any, change: bool) -> None:
        if not change:
            obj.secret = notify.new_secret()
            try:
                notify.target(obj.url)
            except UrlRefused as exc:
                # Saved anyway, as add_webhook does (DNS or the allow-list may change), but said now.
                self.message_user(request, f"Deliveries to this URL would be refused now: {exc}", messages.WARNING)
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: Webhook, post_url_continue: str | None = None) -> HttpResponse:
        if "_popup" in request.POST:
            return super().response_add(request, obj, post_url_continue)
        return _shown_once(request, self, obj, "Webhook signing secret", obj.secret,
                           "Verify deliveries with it (Standard Webhooks); it is not shown again.")

    @admin.display(description="URL")
    def where(self, obj: Webhook) -> str:
        return _redacted(obj.url)

    @admin.display(description="events")
    def event_list(self, obj: Webhook) -> str:
        return ", ".join(obj.events)


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    fields = ["number", "started_at", "finished_at", "status_code", "error", "duration_ms"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["pk", "event_type", "msg_id", "webhook", "status", "attempts", "last_status_code",
                    "next_attempt_at", "delivered_at"]
    list_filter = ["status", "event__type"]
    search_fields = ["event__msg_id"]
    fields = ["event_type", "msg_id", "run", "webhook", "status", "attempts", "last_status_code", "last_error",
              "next_attempt_at", "created_at", "delivered_at"]
    readonly_fields = fields
    inlines = [DeliveryAttemptInline]
    actions = ["resend"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Delivery]:
        return super().get_queryset(request).select_related("event", "webhook")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="event", ordering="event__type")
    def event_type(self, obj: Delivery) -> str:
        return obj.event.type

    @admin.display(description="webhook-id")
    def msg_id(self, obj: Delivery) -> str:
        return obj.event.msg_id

    @admin.display(description="run")
    def run(self, obj: Delivery) -> int:
        return obj.event.run_id

    @admin.action(description="Resend the selected dead deliveries")
    def resend(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        count = notify.resend(queryset)
        self.message_user(request, f"Queued {count} dead delivery(ies) again, with the same webhook-id.", messages.SUCCESS)


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ["user", "email_digest", "email_each_call", "slack_member_id"]
    list_filter = ["email_digest", "email_each_call"]
    # A Slack link is made with proof or by `manage.py link_slack` (which tells the
    # previous owner and times the link), never by typing an id here.
    readonly_fields = ["slack_member_id", "slack_linked_at"]
    search_fields = ["user__username", "slack_member_id"]
    autocomplete_fields = ["user"]


@admin.register(SlackAction)
class SlackActionAdmin(admin.ModelAdmin):
    """The log of Slack clicks: who clicked what, as whom, and what came of it. Read-only:
    it is a record, written by agents.notifications.slack."""

    list_display = ["created_at", "member_id", "user", "approval", "decision", "outcome"]
    list_filter = ["decision"]
    search_fields = ["member_id", "user__username", "outcome"]
    exclude = ["response_url"]  # a capability to post into the channel: not shown

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
