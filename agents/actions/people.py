"""A person leaving (docs/teams.md): what they lose at once, whether the identity
provider refused them or an administrator deactivated them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone

from agents.actions.base import actor_name
from agents.engine import decisions
from agents.engine.human import withdraw_votes
from agents.models import ApiToken, Approval, ApprovalClaim, ApprovalVote, Run
from agents.notifications.links import links_revoke
from agents.runs import store

log = logging.getLogger("airlock.people")

# Sessions read per query while looking for a person's: bounded memory, whatever the count.
SESSION_BATCH = 2000


@dataclass
class Leaving:
    """What one leaving took away, for the log and the tests."""

    sessions: int = 0
    tokens: int = 0
    claims: int = 0
    votes: int = 0
    links: int = 0


def person_leave(*, user: Any, reason: str) -> Leaving:
    """Take away at once what lets `user` act: they were deactivated, or the identity
    provider refused them at sign-in. Each step is idempotent, so leaving twice is fine.

    1. Their sessions: every browser they are logged in on is logged out.
    2. Their API tokens: revoked (the rows stay, with when).
    3. Their claims on calls: released, each claim's record ended "left".
    4. Their votes on calls still waiting: withdrawn under the run's lock, with a
       transition on the run saying so and how many votes the call still needs.
    5. Their emailed decision links: dead.
    What they decided stays on the record under their name: decided approvals, their
    votes there, their runs and their edits are not touched.
    """
    done = Leaving()
    done.sessions = _sessions_end(user.pk)
    done.tokens = ApiToken.objects.filter(user=user).revoke()
    now = timezone.now()
    with transaction.atomic():
        done.claims = ApprovalClaim.objects.filter(user=user, ended_at__isnull=True).update(ended_at=now, end="left")
        Approval.objects.filter(claimed_by=user).update(claimed_by=None, claimed_until=None)
    pending = (
        ApprovalVote.objects.filter(by=user, withdrawn_at__isnull=True, approval__status=decisions.PENDING)
        .values_list("approval_id", flat=True)
        .distinct()
    )
    for approval_id in list(pending):
        done.votes += _votes_withdraw(approval_id, user=user, reason=reason)
    done.links = links_revoke(user=user)
    log.info(
        "person left user=%s (%s): sessions=%s tokens=%s claims=%s votes=%s links=%s",
        user.pk, reason, done.sessions, done.tokens, done.claims, done.votes, done.links,
    )
    return done


def _sessions_end(user_id: int) -> int:
    """Delete the unexpired sessions logged in as `user_id`. Sessions are signed blobs,
    so each is decoded to find its user: read in batches by key (bounded memory), and
    deleted by key, so a session that logs in meanwhile is not lost by mistake."""
    store_ = Session.get_session_store_class()()
    wanted = str(user_id)
    mine: list[str] = []
    last = ""
    while True:
        batch = list(
            Session.objects.filter(expire_date__gt=timezone.now(), session_key__gt=last)
            .order_by("session_key")
            .values_list("session_key", "session_data")[:SESSION_BATCH]
        )
        if not batch:
            break
        mine.extend(key for key, data in batch if str(store_.decode(data).get("_auth_user_id")) == wanted)
        last = batch[-1][0]
    return Session.objects.filter(session_key__in=mine).delete()[0] if mine else 0


def _votes_withdraw(approval_id: int, *, user: Any, reason: str) -> int:
    """Withdraw `user`'s votes in the current round of one waiting call, under the run's
    row lock: votes and decisions on a run queue there (actions.approval_decide), so a
    vote cast meanwhile is counted against the votes left, never against a tally that
    still had this person's."""
    approval = Approval.objects.filter(pk=approval_id).values("run_id").first()
    if approval is None:
        return 0
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("profile").get(pk=approval["run_id"])
        a = Approval.objects.pending().filter(pk=approval_id).first()
        if a is None:
            return 0  # decided meanwhile: what was decided stays, their vote with it
        now = timezone.now()
        withdrawn = ApprovalVote.objects.filter(approval=a, by=user, round=a.round, withdrawn_at__isnull=True).update(
            withdrawn_at=now
        )
        # Votes of earlier rounds (before an edit) already count for nothing: marked too,
        # so the record says why, but they need no transition.
        ApprovalVote.objects.filter(approval=a, by=user, withdrawn_at__isnull=True).update(withdrawn_at=now)
        if not withdrawn:
            return 0
        tally = decisions.tally([v.to_dict() for v in a.current_votes()], a.required)
        state = store.load(run)
        after, t = withdraw_votes(
            state, approval=a.pk, by=user.get_username(), reason=reason, withdrawn=withdrawn,
            needed=max(1, a.required - tally.approvals),
        )
        store.commit(run, state, after, t, actor=actor_name(None), user=None)
    return withdrawn
