"""Admin registrations: API tokens (revocable here, created by command), webhooks and
their deliveries (every attempt; dead ones resent here), notification preferences."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from agents import notify
from agents.models import ApiToken, Delivery, DeliveryAttempt, NotificationPreference, Webhook


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


# -- notifications (issue #14): webhooks, their deliveries and every attempt ----------


def _redacted(url: str) -> str:
    # A webhook URL can itself be a secret (Slack's are): show where, not the path.
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/…" if rest else url


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["pk", "where", "format", "event_list", "active", "created_at"]
    list_filter = ["active", "format"]
    fields = ["where", "events", "format", "active", "created_at"]
    readonly_fields = ["where", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Its secret is shown once, when made: `manage.py add_webhook URL --events ...`.
        return False

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
    list_display = ["user", "email_digest"]
    list_filter = ["email_digest"]
    search_fields = ["user__username"]
    autocomplete_fields = ["user"]
