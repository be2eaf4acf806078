"""Leaving (docs/teams.md#leaving): a person deactivated in the admin, or refused by the
identity provider (tests/accounts/test_oidc.py), loses at once their sessions, API tokens,
claims, votes on calls still waiting, and emailed links; what they decided stays."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from agents.actions import people
from agents.actions.approvals import approval_decide
from agents.actions.tokens import token_create
from agents.models import ApiToken, Approval, ApprovalClaim, ApprovalVote, Transition
from agents.notifications.links import LinkRefused, link_create, link_decide
from tests.helpers import Api, CsrfClient, call, final

pytestmark = pytest.mark.django_db

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("paid")]


def logged_in(user: User) -> CsrfClient:
    client = CsrfClient()
    client.force_login(user)
    return client


def sessions_of(user: User) -> int:
    return sum(1 for s in Session.objects.all() if s.get_decoded().get("_auth_user_id") == str(user.pk))


@pytest.fixture
def world(pending, rita, rob):
    """rita, a reviewer, with everything a reviewer can hold: two browsers, an API
    token, a claim and a vote on a two-person call, an emailed link, and a call she
    decided alone."""
    browsers = [logged_in(rita), logged_in(rita)]
    waiting = pending(SCRIPT, policy={"rules": [TWO_PEOPLE]})
    assert approval_decide(approval_id=waiting.pk, user=rita, decision="approve", note="fine by me").outcome == "voted"
    until = timezone.now() + dt.timedelta(minutes=10)
    Approval.objects.filter(pk=waiting.pk).update(claimed_by=rita, claimed_until=until)
    ApprovalClaim.objects.create(approval=waiting, user=rita, until=until)
    decided = pending()
    assert approval_decide(approval_id=decided.pk, user=rita, decision="approve", note="ok").won
    return {
        "browsers": browsers,
        "rob": logged_in(rob),
        "token": token_create(user=rita)[1],
        "waiting": waiting,
        "decided": decided,
        "link": link_create(user=rita, approval=Approval.objects.get(pk=waiting.pk)),
    }


def test_deactivating_a_person_takes_everything_away_at_once(world, rita, rob) -> None:
    assert sessions_of(rita) == 2 and Api(world["token"]).get("/api/runs").status_code == 200

    rita.is_active = False
    rita.save()  # what the admin's "Active" box does

    # Sessions: both of her browsers are logged out; rob's is not.
    assert sessions_of(rita) == 0
    for browser in world["browsers"]:
        assert browser.get("/reviews/").status_code == 302
    assert world["rob"].get("/reviews/").status_code == 200
    # Tokens: revoked, on the record.
    assert Api(world["token"]).get("/api/runs").status_code == 401
    assert ApiToken.objects.get(user=rita).revoked_at is not None
    # Claims: released, the claim's record ended "left".
    waiting = Approval.objects.get(pk=world["waiting"].pk)
    assert (waiting.claimed_by_id, waiting.claimed_until) == (None, None)
    assert list(ApprovalClaim.objects.filter(user=rita).values_list("end", flat=True)) == ["left"]
    # Votes: withdrawn, still on the record; the call waits for two votes again.
    assert waiting.status == "pending" and waiting.to_dict()["votes"] == []
    vote = ApprovalVote.objects.get(approval=waiting, by=rita)
    assert vote.withdrawn_at is not None and vote.note == "fine by me"
    t = Transition.objects.filter(run_id=waiting.run_id).order_by("-seq").first()
    assert (t.kind, t.from_state, t.to_state) == ("withdraw", "awaiting_approval", "awaiting_approval")
    assert t.payload["reason"] == "1 vote by rita withdrawn (deactivated): the call needs 2 more votes"
    assert t.actor == "system"
    # Links: dead, and the page says why.
    with pytest.raises(LinkRefused) as refused:
        link_decide(token=world["link"], user=AnonymousUser(), decision="approve")
    assert refused.value.why.code == "revoked"
    # What she decided stays hers.
    decided = Approval.objects.get(pk=world["decided"].pk)
    assert (decided.status, decided.decided_by_id, decided.note) == ("approved", rita.pk, "ok")
    assert ApprovalVote.objects.get(approval=decided, by=rita).withdrawn_at is None


def test_the_call_says_it_needs_another_vote_and_her_vote_no_longer_counts(world, rita, rob) -> None:
    rita.is_active = False
    rita.save()
    waiting = world["waiting"]
    timeline = world["rob"].get(f"/runs/{waiting.run_id}/").content.decode()
    assert "1 vote by rita withdrawn (deactivated): the call needs 2 more votes" in timeline
    assert "(withdrawn: the voter left)" in timeline
    page = world["rob"].get(f"/reviews/{waiting.pk}/").content.decode()
    assert "0 of 2 approvals" in page
    assert "the reviewer left; it no longer counts" in page

    # rob's approval alone does not decide: rita's withdrawn vote is not counted.
    assert approval_decide(approval_id=waiting.pk, user=rob, decision="approve").outcome == "voted"
    assert Approval.objects.get(pk=waiting.pk).status == "pending"


def test_deactivating_in_the_admin_makes_the_person_leave(world, rita, root) -> None:
    admin = logged_in(root)
    form = admin.get(f"/admin/auth/user/{rita.pk}/change/")
    assert form.status_code == 200
    response = admin.post(
        f"/admin/auth/user/{rita.pk}/change/",
        {
            "username": "rita", "first_name": "", "last_name": "", "email": "", "is_staff": "",
            "groups": list(rita.groups.values_list("pk", flat=True)),
            "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2026-01-01", "initial-date_joined_1": "00:00:00",
            "csrfmiddlewaretoken": admin.token(),
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert not User.objects.get(pk=rita.pk).is_active
    assert sessions_of(rita) == 0
    assert Approval.objects.get(pk=world["waiting"].pk).to_dict()["votes"] == []


def test_leaving_twice_finds_nothing_left_to_take(world, rita) -> None:
    first = people.person_leave(user=rita, reason="test")
    assert (first.sessions, first.tokens, first.claims, first.votes, first.links) == (2, 1, 1, 1, 1)
    again = people.person_leave(user=rita, reason="test")
    assert (again.sessions, again.tokens, again.claims, again.votes, again.links) == (0, 0, 0, 0, 0)
    assert Transition.objects.filter(run_id=world["waiting"].run_id, kind="withdraw").count() == 1


def test_only_the_leavers_sessions_go_among_thousands(rita, rob) -> None:
    """Sessions are read in batches (people.SESSION_BATCH): hers are found past the
    first batch, and nobody else's is touched."""
    expires = timezone.now() + dt.timedelta(days=1)
    store = SessionStore()
    Session.objects.bulk_create(
        Session(session_key=f"k{i:05d}", session_data=store.encode({"_auth_user_id": str(rob.pk)}), expire_date=expires)
        for i in range(people.SESSION_BATCH + 500)
    )
    for key in ("k00000a", f"k{people.SESSION_BATCH + 100:05d}a"):
        Session.objects.create(session_key=key, session_data=store.encode({"_auth_user_id": str(rita.pk)}), expire_date=expires)
    assert people.person_leave(user=rita, reason="test").sessions == 2
    assert Session.objects.count() == people.SESSION_BATCH + 500


def test_saving_an_active_person_takes_nothing(world, rita) -> None:
    rita.first_name = "Rita"
    rita.save()
    assert sessions_of(rita) == 2
    assert Approval.objects.get(pk=world["waiting"].pk).to_dict()["votes"] != []
    assert Client().get("/login/").status_code == 200
