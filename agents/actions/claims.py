"""Claims: a reviewer says "I'm on it" about a pending call (docs/reviewing.md#claims).

A claim only tells: it never stops another reviewer from deciding (the decision is still
the compare-and-set in `actions.approval_decide`). It is the approval's `claimed_by` and
`claimed_until` (the queue reads those) and one `ApprovalClaim` row from taking to
letting go (the stats read those). A claim whose `claimed_until` has passed is no claim
everywhere at once (`Approval.claim_is_live`); its row is recorded as lapsed by the next
claim of the call or by the sweeper (`claims_lapse`), whichever comes first, once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agents import access
from agents.actions.base import ActionError
from agents.models import Approval, ApprovalClaim

SWEEP_BATCH = 500


def claim_minutes() -> dt.timedelta:
    return dt.timedelta(minutes=settings.AIRLOCK_CLAIM_MINUTES)


def _holder(approval: Approval) -> dict[str, Any]:
    """Who holds the live claim on `approval`, as a 409's detail tells it."""
    who = approval.claimed_by.get_username() if approval.claimed_by else "someone"
    until = approval.claimed_until
    return {
        "message": f"approval {approval.pk} is claimed by {who} until {until:%H:%M} UTC" if until else "",
        "claimed_by": who,
        "claimed_until": until,  # as the approval JSON writes times
    }


def _visible(approval_id: int, user: Any) -> Approval:
    approval = None
    if 0 < approval_id <= access.MAX_ID:
        approval = access.visible_approvals(user).select_related("run", "claimed_by").filter(pk=approval_id).first()
    if approval is None:
        raise ActionError("not_found", f"no approval {approval_id}", status=404)
    return approval


def approval_claim(*, approval_id: int, user: Any) -> Approval:
    """Claim a pending call for `user` for AIRLOCK_CLAIM_MINUTES; claiming it again
    extends the claim. Refused: 404 for a call the user cannot see, 403 for one they
    may not decide, 409 `not_pending` once it is decided, 409 `claimed` (with who and
    until) while another reviewer's claim is live.

    1. One conditional update takes the claim: the call is pending and nobody holds a
       live claim, or `user` does. Of two reviewers claiming at once the first update
       wins; the second waits on the row lock, finds the winner's claim and matches
       nothing.
    2. In the same transaction, which holds the approval's row lock from step 1 (every
       claim of the call queues there): an earlier claim that lapsed is recorded as
       lapsed; the user's own live claim is extended, or a new claim row is written.
    """
    approval = _visible(approval_id, user)
    if not access.can_claim(user, approval):
        raise ActionError("forbidden", "only reviewers who may decide this call may claim it", status=403)
    now = timezone.now()
    until = now + claim_minutes()
    with transaction.atomic():
        free = Q(claimed_by__isnull=True) | Q(claimed_until__isnull=True) | Q(claimed_until__lte=now) | Q(claimed_by=user)
        taken = Approval.objects.pending().filter(free, pk=approval_id).update(claimed_by=user, claimed_until=until)
        if taken != 1:
            current = Approval.objects.select_related("claimed_by").get(pk=approval_id)
            if not current.is_pending:
                raise ActionError("not_pending", f"approval {approval_id} is already {current.status}", status=409)
            # Another reviewer's live claim (theirs committed first).
            raise ActionError("claimed", _holder(current), status=409)
        claims = ApprovalClaim.objects.filter(approval_id=approval_id)
        # A claim that ran out is over, ours included: a new one starts.
        claims.open().filter(until__lte=now).update(ended_at=F("until"), end="lapsed")
        if not claims.open().filter(user=user).update(until=until):
            # Any other open row names a claim step 1 found gone (released, lapsed).
            claims.close("lapsed", now)
            ApprovalClaim.objects.create(approval_id=approval_id, user=user, until=until)
    return Approval.objects.select_related("claimed_by", "decided_by", "edited_by").get(pk=approval_id)


def approval_release(*, approval_id: int, user: Any) -> Approval:
    """Let go of a claim. Releasing a call nobody holds (or whose claim lapsed) answers
    with it unchanged; another reviewer's live claim is a 409 `not_claimant`, except to
    a superuser, who may release anyone's."""
    approval = _visible(approval_id, user)
    now = timezone.now()
    with transaction.atomic():
        mine = Approval.objects.filter(pk=approval_id, claimed_until__gt=now)
        if not user.is_superuser:
            mine = mine.filter(claimed_by=user)
        released = mine.update(claimed_by=None, claimed_until=None)
        if released:
            ApprovalClaim.objects.filter(approval_id=approval_id).close("released", now)
        else:
            current = Approval.objects.select_related("claimed_by").get(pk=approval.pk)
            if current.claim_is_live(now):
                detail = _holder(current)
                detail["message"] = f"you hold no claim on approval {approval_id}: {detail['message']}"
                raise ActionError("not_claimant", detail, status=409)
            # Nothing live to release; a lapsed claim is recorded as such now.
            ApprovalClaim.objects.filter(approval_id=approval_id).close("lapsed", now)
    return Approval.objects.select_related("claimed_by", "decided_by", "edited_by").get(pk=approval_id)


def claims_end_for_user(*, user: Any, end: str = "logout") -> int:
    """End every live claim `user` holds (they logged out); how many ended."""
    if user is None or not getattr(user, "pk", None):
        return 0
    now = timezone.now()
    with transaction.atomic():
        Approval.objects.filter(claimed_by=user).update(claimed_by=None, claimed_until=None)
        return int(ApprovalClaim.objects.filter(user=user).close(end, now))


def claims_lapse(*, now: dt.datetime | None = None) -> int:
    """Record the claims whose time ran out as lapsed, once each (the sweeper calls
    this): safe with concurrent sweepers, as each row's close is a conditional update
    (`ended_at IS NULL`) that the second sweeper finds already done. The approvals'
    `claimed_by` is cleared only where it still names that lapsed claim: a reviewer
    who claimed the call since keeps theirs."""
    now = now or timezone.now()
    due = list(
        ApprovalClaim.objects.open().filter(until__lte=now).order_by("until").values_list("pk", "approval_id")[:SWEEP_BATCH]
    )
    if not due:
        return 0
    lapsed = ApprovalClaim.objects.filter(pk__in=[pk for pk, _ in due]).close("lapsed", now)
    Approval.objects.filter(pk__in={a for _, a in due}, claimed_until__lte=now).update(claimed_by=None, claimed_until=None)
    return lapsed


def on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Django's `user_logged_out` (connected in agents/apps.py): a reviewer who leaves
    holds nothing."""
    claims_end_for_user(user=user, end="logout")
