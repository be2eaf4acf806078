"""Emailed decision links (`/reviews/links/<token>/`): bound to one reviewer, one
approval and the call's arguments as mailed (`args_hash`).

The token is 32 random bytes, only ever in the email; the database keeps its sha256.
A link is single-use and dead once the approval is no longer pending with those
arguments (decided anywhere, expired, edited, the run ended) or after
AIRLOCK_EMAIL_LINK_HOURS. Opening it (GET) changes nothing, so a mail scanner that
fetches every link decides nothing; only the confirm page's POST decides, as the bound
reviewer, through `agents.actions.approvals.approval_decide` (`via="email"`), with every rule a
dashboard click meets.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from agents import access
from agents.actions.approvals import DecisionResult, approval_decide
from agents.actions.base import ActionError
from agents.models import Approval, DecisionLink

log = logging.getLogger("airlock.links")

TOKEN_BYTES = 32
# A revoked link's `outcome`: its reviewer left (agents/actions/people.py); it is spent.
REVOKED = "revoked: the reviewer left"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def link_create(
    *, user: Any, approval: Approval, now: dt.datetime | None = None, until: dt.datetime | None = None
) -> str:
    """A new link for `user` to decide `approval` as it stands; returns the token (the
    only copy: put it in the email). It lives AIRLOCK_EMAIL_LINK_HOURS, or only `until`
    (the call's expiry or its run's deadline) when that comes first: an email must not
    promise a link longer than the call it decides."""
    now = now or timezone.now()
    expires_at = now + dt.timedelta(hours=settings.AIRLOCK_EMAIL_LINK_HOURS)
    if until is not None:
        expires_at = min(expires_at, until)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    DecisionLink.objects.create(
        token_hash=_hash(token),
        user=user,
        approval=approval,
        args_hash=approval.args_hash,
        created_at=now,
        expires_at=expires_at,
    )
    return token


def links_revoke(*, user: Any) -> int:
    """Kill every unused link sent to `user` (they left); returns how many."""
    return DecisionLink.objects.filter(user=user, used_at__isnull=True).update(used_at=timezone.now(), outcome=REVOKED)


def link_url(token: str) -> str:
    return settings.AIRLOCK_BASE_URL + reverse("reviews:link", args=[token])


def link_find(token: str) -> DecisionLink | None:
    if not token or len(token) > 200:
        return None
    return (
        DecisionLink.objects.select_related("user", "approval__run__profile", "approval__decided_by")
        .filter(token_hash=_hash(token))
        .first()
    )


def needs_step_up(approval: Approval) -> bool:
    """An irreversible call, or one whose rule says `"step_up": true`, is decided only
    by the bound reviewer logged in with their own session, never by the link alone."""
    rule = approval.rule if isinstance(approval.rule, dict) else {}
    return approval.risk == "irreversible" or bool(rule.get("step_up"))


@dataclass(frozen=True)
class Refusal:
    # revoked, used, expired (the link), call_expired, decided, changed, run_ended,
    # wrong_user, step_up, duties
    code: str
    message: str
    status: int


def refusal(link: DecisionLink, user: Any, *, now: dt.datetime | None = None) -> Refusal | None:
    """Why this link may not decide now (for the page and for the POST alike), or None.
    `user` is who is logged in on this browser (anonymous is fine)."""
    now = now or timezone.now()
    a = link.approval
    if link.outcome == REVOKED:
        return Refusal("revoked", f"This link was revoked: {link.user.get_username()} no longer reviews here.", 410)
    if link.used_at is not None:
        return Refusal("used", f"This link was already used ({link.outcome or 'answered'}); it works once.", 410)
    if user.is_authenticated and user.pk != link.user_id:
        return Refusal(
            "wrong_user",
            f"This link was sent to {link.user.get_username()}; you are logged in as {user.get_username()}. "
            "Nothing was recorded.",
            403,
        )
    if a.status == "expired":
        # Not "decided elsewhere": nobody decided it, the time to answer ran out.
        at = f" at {timezone.localtime(a.decided_at):%Y-%m-%d %H:%M %Z}" if a.decided_at else ""
        return Refusal("call_expired", f"This call expired{at}: nobody answered in time, so it will not run.", 410)
    if not a.is_pending:
        who = f" by {a.decided_by.get_username()}" if a.decided_by else ""
        via = f" via {a.via}" if a.via else ""
        return Refusal("decided", f"This call was already decided elsewhere: {a.decided_label.lower()}{who}{via}.", 409)
    if a.run.is_terminal:
        return Refusal("run_ended", f"The run ended ({a.run.state}); this call will not run.", 410)
    if a.args_hash != link.args_hash:
        return Refusal(
            "changed", "The call changed since this email was sent (its arguments were edited): review it again.", 409
        )
    if link.expires_at <= now:
        return Refusal("expired", "This link expired; open the call in Airlock to decide it.", 410)
    if access.duties_separated(link.user, a.run):
        return Refusal(
            "duties", "You launched this run and its policy separates duties: another reviewer decides.", 403
        )
    if not access.may_decide(link.user, a):
        return Refusal(
            "not_reviewer", f"{link.user.get_username()} may not decide this call: {access.review_refusal(a)}.", 403
        )
    return None


def step_up_required(link: DecisionLink, user: Any) -> bool:
    """True while this call needs the bound reviewer's own session and this browser has none."""
    return needs_step_up(link.approval) and not (user.is_authenticated and user.pk == link.user_id)


class LinkRefused(Exception):
    def __init__(self, why: Refusal) -> None:
        super().__init__(why.message)
        self.why = why


def link_decide(*, token: str, user: Any, decision: str, note: str = "") -> DecisionResult:
    """Decide through a link, once.

    1. Lock the link's row: two POSTs of one link (a double click, two tabs) queue here,
       and the second finds it used.
    2. Refuse what the page would refuse (`refusal`, `step_up_required`).
    3. Vote as the bound reviewer for the call as mailed (`args_hash`), via email; the
       vote and the link's use commit together, so a refused vote leaves the link unused
       and a recorded one leaves it spent.
    Raises LinkRefused, or ActionError from approval_decide."""
    found = link_find(token)
    if found is None:
        raise LinkRefused(Refusal("unknown", "This link is not valid.", 404))
    if decision not in ("approve", "reject"):
        raise ActionError("invalid_decision", "approve or reject")
    with transaction.atomic():
        link = DecisionLink.objects.select_for_update().get(pk=found.pk)
        link.approval = Approval.objects.select_related("run__profile", "decided_by").get(pk=link.approval_id)
        link.user = found.user
        why = refusal(link, user)
        if why is None and step_up_required(link, user):
            why = Refusal("step_up", "This call needs you to log in before deciding.", 403)
        if why is not None:
            log.info("email link for approval=%s refused: %s", link.approval_id, why.code)
            raise LinkRefused(why)
        result = approval_decide(
            approval_id=link.approval_id,
            user=link.user,
            decision=decision,
            note=note,
            args_hash=link.args_hash,
            via="email",
            by_reviewer=True,
        )
        done = {"approve": "approved", "reject": "rejected"}[decision]
        outcome = {"decided": done, "voted": f"voted to {decision}"}.get(
            result.outcome, result.outcome.replace("_", " ")
        )
        DecisionLink.objects.filter(pk=link.pk).update(used_at=timezone.now(), outcome=outcome)
    log.info("email link for approval=%s used by user=%s: %s", link.approval_id, link.user_id, result.outcome)
    return result
