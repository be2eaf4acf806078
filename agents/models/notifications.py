"""What leaves Airlock: webhooks, outbox events, deliveries and their attempts, and
the reviewers' notification preferences."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models

from agents.models.fields import URLField

EVENT_TYPES = (
    "approval.pending",
    "approval.decided",
    "approval.expired",
    "approval.expiring",
    "approval.escalated",
    "run.done",
    "run.failed",
    "run.cancelled",
)


class Webhook(models.Model):
    """A receiver of events, signed the Standard Webhooks way with its own secret."""

    FORMATS = [("json", "json"), ("slack", "slack")]

    url = URLField(max_length=2000, validators=[URLValidator(schemes=["http", "https"])])
    # The HMAC key must be kept to sign with, so it is stored; it is shown once, when
    # `manage.py add_webhook` makes it, and never on a page or in a log.
    secret = models.CharField(max_length=100, editable=False)
    events = models.JSONField(default=list, help_text=f"event types, of {', '.join(EVENT_TYPES)}")
    format = models.CharField(max_length=10, choices=FORMATS, default="json")
    active = models.BooleanField(default=True)
    # The project whose events it receives (`add_webhook ... --project SLUG`); null: every project's.
    project = models.ForeignKey(
        "agents.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="webhooks"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"webhook {self.pk} ({self.format}: {', '.join(self.events)})"

    def wants(self, event_type: str, project_id: int | None = None) -> bool:
        """Whether this webhook receives the event: subscribed to its type and, for an
        event of a run in `project_id`, the project's own webhook or one of every
        project (`project` null, which only a superuser makes)."""
        if self.project_id is not None and self.project_id != project_id:
            return False
        return self.active and event_type in self.events

    def clean_fields(self, exclude: Any = None) -> None:
        """As Django's, but each message once: URLField's own validator and the
        http(s)-only one both refuse `ftp://x` with the same words, which the admin, the
        project admin and `add_webhook` would otherwise all print twice."""
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as exc:
            raise ValidationError({f: list(dict.fromkeys(msgs)) for f, msgs in exc.message_dict.items()}) from None

    def clean(self) -> None:
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
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+")
    approval = models.ForeignKey("agents.Approval", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="rendered and fanned out to webhooks")

    class Meta:
        indexes = [
            # What the dispatcher and the digest look for: small, the rest is history.
            models.Index(fields=["id"], condition=models.Q(dispatched_at__isnull=True), name="outbox_undispatched"),
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
    # Due when in the past; an attempt leases it by pushing it past its timeout, so a worker
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
    email_each_call = models.BooleanField(default=False, help_text="email me each call as it starts waiting")
    # The reviewer's Slack member id (U...): a click on a Slack button decides as this
    # user only when it came from this member. Unique among those set. Linked only with
    # proof (a signed click of that member, or an admin's link_slack): agents.notifications.slack.
    slack_member_id = models.CharField(max_length=40, blank=True, default="")
    # When it was linked: a click on a message sent before then decides nothing (the
    # member's clicks were someone else's when it was sent). Null: linked before this
    # was recorded.
    slack_linked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["slack_member_id"], condition=~models.Q(slack_member_id=""), name="slack_member_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user}: digest {'on' if self.email_digest else 'off'}"

    @classmethod
    def digest_on(cls, user: Any) -> bool:
        return not cls.objects.filter(user=user, email_digest=False).exists()

    @classmethod
    def set_digest(cls, user: Any, on: bool) -> None:
        cls.objects.update_or_create(user=user, defaults={"email_digest": on})


class DigestEntry(models.Model):
    """One pending call mailed to one reviewer: what their later digests leave out. Kept
    per reviewer, not per call, so someone who joins (or adds an email address) while
    calls wait is told about all of them (agents.notifications.delivery.send_digest)."""

    # (user, approval) is unique, so that index serves the user's foreign key too.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    approval = models.ForeignKey("agents.Approval", on_delete=models.CASCADE, related_name="digest_entries")
    mailed_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "approval"], name="digest_once_per_reviewer")]
        verbose_name_plural = "digest entries"

    def __str__(self) -> str:
        return f"approval {self.approval_id} mailed to user {self.user_id}"


class DecisionLink(models.Model):
    """An emailed link that decides one approval as one reviewer, for the call as it was
    mailed (`args_hash`). The token itself is only in the email; this row keeps its
    sha256. Single-use (`used_at`), and dead once the approval is no longer pending with
    these arguments, or after AIRLOCK_EMAIL_LINK_HOURS."""

    token_hash = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    approval = models.ForeignKey("agents.Approval", on_delete=models.CASCADE, related_name="+")
    args_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=100, blank=True)

    def __str__(self) -> str:
        return f"link for approval {self.approval_id} to user {self.user_id}"


class SlackAction(models.Model):
    """One click on a Slack button, as Slack delivered it: the log of who clicked what
    and what came of it, and the `response_url` to update the message with. Slack
    retries a delivery with the same `action_ts`: (member, action_ts) is unique, so a
    retried delivery finds its row and decides nothing."""

    member_id = models.CharField(max_length=40)
    action_ts = models.CharField(max_length=40)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    approval = models.ForeignKey("agents.Approval", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    decision = models.CharField(max_length=10)
    response_url = URLField(max_length=2000, blank=True)
    outcome = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_message_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["member_id", "action_ts"], name="slack_action_once")]

    def __str__(self) -> str:
        return f"slack {self.decision} by {self.member_id}: {self.outcome}"
