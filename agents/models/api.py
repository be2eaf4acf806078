"""The API's rows: tokens and the launch idempotency keys."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


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
    # A token limited to one project (`create_api_token USER --project SLUG`); null: all of the user's.
    project = models.ForeignKey("agents.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="+")

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
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key")]
