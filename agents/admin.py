"""Admin registrations: agent profiles (their policy included) and API tokens
(revocable here, created by command)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from agents.models import AgentProfile, ApiToken


@admin.register(AgentProfile)
class AgentProfileAdmin(admin.ModelAdmin):
    """Rules are validated on save by `AgentProfile.clean()`; an error names the rule
    and the field (`rules[2].when.op: ...`). Runs keep the policy they launched with."""

    list_display = ["name", "provider", "model_name", "separate_duties", "irreversible_approvals"]
    search_fields = ["name", "description"]
    fieldsets = [
        (None, {"fields": ["name", "description", "provider", "model_name", "system_prompt"]}),
        ("Model endpoint", {"fields": ["base_url", "api_key_env", "context_tokens"]}),
        ("Tools", {"fields": ["tools", "denied_tools", "always_ask_tools"]}),
        ("Policy", {
            "fields": ["rules", "irreversible_approvals", "separate_duties", "approval_timeout_seconds", "on_expiry"],
            "description": "Argument rules, first match wins; see docs/policy.md.",
        }),
        ("Budget", {"fields": [
            "limits", "price_input_micros", "price_output_micros", "price_cached_input_micros", "price_cache_write_micros",
        ]}),
    ]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["user__username", "name", "prefix"]
    readonly_fields = ["user", "prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A token is shown once, when made: `manage.py create_api_token USER`.
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
