"""API tokens: created once, stored as sha256, revocable."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.utils import timezone

from agents.models import ApiToken
from agents.runs import rows

PREFIX = "airlock_"
# Every API request and gateway call reads this: written out (agents/runs/rows.py), it
# skips building the queryset each time.
_ACTIVE = rows.Joined(ApiToken, ["user"], "a.digest = %s AND a.revoked_at IS NULL AND b0.is_active = %s")


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()


def token_issue(token: ApiToken) -> str:
    """Give an unsaved token a new secret (its digest and prefix); returns the raw token,
    to show once and never store. The command and the admin both come here."""
    raw = PREFIX + secrets.token_urlsafe(32)
    token.digest = digest(raw)
    token.prefix = raw[: len(PREFIX) + 6]
    return raw


def token_create(*, user: Any, name: str = "", project: Any = None) -> tuple[ApiToken, str]:
    """A new token for `user` (limited to `project` when given): the row, and the raw
    token (shown once, never stored)."""
    token = ApiToken(user=user, name=name[:100], project=project)
    raw = token_issue(token)
    token.save()
    return token, raw


def token_user(raw: str) -> Any:
    """The active user a raw token belongs to, or None (unknown, revoked, inactive user).
    A token limited to a project marks the user object so (agents.access.token_project):
    every rule then answers for that project alone, whatever else the user holds."""
    if not raw or len(raw) > 200:
        return None
    found = _ACTIVE.fetch([digest(raw), True])
    if not found:
        return None
    token = found[0]
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        # At most one write a minute per token: "last used" is for humans, not an audit log.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    user = token.user
    user._airlock_token_project = token.project_id
    return user


def token_revoke(*, token_id: int | None = None, user: Any = None) -> int:
    """Revoke one token by id, or every active token of `user`; returns how many."""
    tokens = ApiToken.objects.all()
    if token_id is not None:
        tokens = tokens.filter(pk=token_id)
    if user is not None:
        tokens = tokens.filter(user=user)
    if token_id is None and user is None:
        raise ValueError("name a token or a user")
    return tokens.revoke()
