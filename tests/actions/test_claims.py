"""Claims ("I'm on it"): taking, seeing, extending, releasing, lapsing and ending a claim
on a pending call, in the queue, the API and the sweeper (docs/reviewing.md#claims)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents.actions.approvals import approval_decide, approval_expire
from agents.actions.base import ActionError
from agents.actions.claims import approval_claim, approval_release, claims_lapse
from agents.actions.runs import run_cancel
from agents.models import Approval, ApprovalClaim
from agents.runs.sweeper import sweep
from tests.helpers import CsrfClient, at_once, person, requires_postgres

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def claim_rows(approval: Approval) -> list[tuple[str, str]]:
    """(who, end) of every claim of the call, oldest first; end "" while open."""
    rows = ApprovalClaim.objects.filter(approval=approval).order_by("pk")
    return [(c.user.username if c.user else "", c.end) for c in rows]


def card_html(client: CsrfClient, approval: Approval) -> str:
    html = client.get("/reviews/").content.decode()
    match = re.search(rf'<article[^>]*id="approval-{approval.pk}".*?</article>', html, re.S)
    assert match, f"no card for approval {approval.pk}"
    return match.group(0)


def post(client: CsrfClient, approval: Approval, action: str, *, htmx: bool = False, **data: str):
    headers = {"X-CSRFToken": client.token(), **(HTMX if htmx else {})}
    return client.post(f"/reviews/{approval.pk}/{action}/", data, headers=headers)


def lapse(approval: Approval) -> None:
    """Move the claim's time into the past, as ten minutes passing would."""
    past = timezone.now() - dt.timedelta(seconds=1)
    Approval.objects.filter(pk=approval.pk).update(claimed_until=past)
    ApprovalClaim.objects.filter(approval=approval, ended_at__isnull=True).update(until=past)


# -- taking and seeing a claim -------------------------------------------------------


def test_a_claim_is_seen_by_another_reviewer_with_who_and_until(pending, rita, rob, as_user) -> None:
    approval = pending()
    response = post(as_user(rita), approval, "claim")
    assert response.status_code == 303 and response["Location"] == "/reviews/"
    a = Approval.objects.get(pk=approval.pk)
    assert a.claimed_by == rita and a.claimed_until is not None
    assert dt.timedelta(minutes=9) < a.claimed_until - timezone.now() <= dt.timedelta(minutes=10)
    assert claim_rows(approval) == [("rita", "")]
    until = timezone.localtime(a.claimed_until).strftime("%H:%M")
    theirs = card_html(as_user(rob), approval)
    assert 'Claimed by <strong class="who">rita</strong> until <time' in theirs and f">{until}</time>" in theirs
    assert ">Claim</button>" not in theirs and "Release" not in theirs  # rob can neither take nor release it
    mine = card_html(as_user(rita), approval)
    assert "You claimed this until" in mine and ">Release</button>" in mine and ">Extend claim</button>" in mine


def test_the_approval_page_shows_the_claim(pending, rita, rob, as_user) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    html = as_user(rob).get(f"/reviews/{approval.pk}/").content.decode()
    assert 'Claimed by <strong class="who">rita</strong>' in html


def test_claiming_again_extends_the_same_claim(pending, rita, settings) -> None:
    approval = pending()
    first = approval_claim(approval_id=approval.pk, user=rita).claimed_until
    settings.AIRLOCK_CLAIM_MINUTES = 30
    second = approval_claim(approval_id=approval.pk, user=rita).claimed_until
    assert first is not None and second is not None and second - first > dt.timedelta(minutes=19)
    assert claim_rows(approval) == [("rita", "")]
    assert ApprovalClaim.objects.get(approval=approval).until == second


def test_a_claim_held_by_another_is_refused_on_the_card_with_who_holds_it(pending, rita, rob, as_user) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    response = post(as_user(rob), approval, "claim", htmx=True)
    assert response.status_code == 409
    html = response.content.decode()
    assert html.startswith(f'<div class="claim is-claimed" id="approval-{approval.pk}-claim"')
    assert 'Claimed by <strong class="who">rita</strong>' in html and "is claimed by rita until" in html
    assert Approval.objects.get(pk=approval.pk).claimed_by == rita
    # Without htmx: back to the queue, with the message.
    client = as_user(rob)
    response = post(client, approval, "claim")
    assert response.status_code == 303
    assert "is claimed by rita until" in client.get(response["Location"]).content.decode()
    assert claim_rows(approval) == [("rita", "")]


def test_the_htmx_claim_answers_the_claim_line_and_keeps_the_filters(pending, rita, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    response = post(client, approval, "claim", htmx=True, claimed="none", q="ledger")
    assert response.status_code == 200
    html = response.content.decode()
    assert "You claimed this until" in html and "Claimed call" in html
    assert '<input type="hidden" name="claimed" value="none">' in html and 'name="q" value="ledger"' in html
    assert "approvalClaimed" in response["HX-Trigger"]
    response = post(client, approval, "release", claimed="none", q="ledger")
    assert response.status_code == 303 and response["Location"] == "/reviews/?claimed=none&q=ledger"


# An operator reads every call and a launcher their own run's, but neither decides; a
# user in no group cannot even see the call.
@pytest.mark.parametrize(("who", "status"), [("otto", 403), ("lena", 403), ("nina", 404)])
def test_only_those_who_may_decide_may_claim(pending, users, nina, who, status, as_user) -> None:
    approval = pending(user=users["lena"])
    user = nina if who == "nina" else users[who]
    assert post(as_user(user), approval, "claim").status_code == status
    assert Approval.objects.get(pk=approval.pk).claimed_by is None
    with pytest.raises(ActionError) as refused:
        approval_claim(approval_id=approval.pk, user=user)
    assert refused.value.status == status


def test_the_launcher_of_a_run_with_separated_duties_may_not_claim(pending, defaults) -> None:
    boss = person("boss", "reviewer", "launcher")
    approval = pending(user=boss, policy={"separate_duties": True})
    with pytest.raises(ActionError) as refused:
        approval_claim(approval_id=approval.pk, user=boss)
    assert refused.value.status == 403


def test_claim_and_release_need_a_post_with_csrf(pending, rita) -> None:
    approval = pending()
    client = CsrfClient()
    client.force_login(rita)
    assert client.get(f"/reviews/{approval.pk}/claim/").status_code == 405
    assert client.post(f"/reviews/{approval.pk}/claim/").status_code == 403  # no CSRF token
    assert Approval.objects.get(pk=approval.pk).claimed_by is None


def test_claiming_a_decided_call_is_refused(pending, rita, rob) -> None:
    approval = pending()
    approval_decide(approval_id=approval.pk, user=rob, decision="approve")
    with pytest.raises(ActionError) as refused:
        approval_claim(approval_id=approval.pk, user=rita)
    assert (refused.value.status, refused.value.code) == (409, "not_pending")


# -- a claim only tells ----------------------------------------------------------------


def test_a_claim_does_not_stop_another_reviewer_from_deciding(pending, rita, rob, as_user) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    response = as_user(rob).decide(approval.pk, "approve")
    assert response.status_code == 303
    a = Approval.objects.get(pk=approval.pk)
    assert (a.status, a.decided_by, a.claimed_by, a.claimed_until) == ("approved", rob, None, None)
    assert claim_rows(approval) == [("rita", "left")]


def test_deciding_ends_the_claimants_claim(pending, rita) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="no")
    a = Approval.objects.get(pk=approval.pk)
    assert (a.status, a.claimed_by, a.claimed_until) == ("rejected", None, None)
    claim = ApprovalClaim.objects.get(approval=approval)
    assert claim.end == "decided" and claim.ended_at == a.decided_at


def test_a_vote_that_does_not_decide_keeps_the_claim(pending, rita, rob) -> None:
    approval = pending(policy={"rules": [{"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two"}]})
    approval_claim(approval_id=approval.pk, user=rita)
    assert approval_decide(approval_id=approval.pk, user=rob, decision="approve").outcome == "voted"
    assert Approval.objects.get(pk=approval.pk).claimed_by == rita
    assert claim_rows(approval) == [("rita", "")]


def test_a_call_that_leaves_the_queue_otherwise_ends_its_claim(pending, rita, root) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    run_cancel(run_id=approval.run_id, user=root)
    a = Approval.objects.get(pk=approval.pk)
    assert (a.status, a.claimed_by, a.claimed_until) == ("expired", None, None)
    assert claim_rows(approval) == [("rita", "left")]


def test_an_expired_call_ends_its_claim(pending, rita) -> None:
    approval = pending(policy={"approval_timeout_seconds": 60})
    approval_claim(approval_id=approval.pk, user=rita)
    assert approval.expires_at is not None
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=approval.expires_at.timestamp() + 1)
    a = Approval.objects.get(pk=approval.pk)
    assert (a.status, a.claimed_by) == ("expired", None)
    assert claim_rows(approval) == [("rita", "left")]


# -- releasing, logging out ------------------------------------------------------------


def test_release_ends_the_claim_and_a_second_release_changes_nothing(pending, rita, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    post(client, approval, "claim")
    assert post(client, approval, "release").status_code == 303
    assert Approval.objects.get(pk=approval.pk).claimed_by is None
    assert claim_rows(approval) == [("rita", "released")]
    assert post(client, approval, "release").status_code == 303
    assert claim_rows(approval) == [("rita", "released")]
    assert "Claim</button>" in card_html(client, approval)


def test_releasing_another_reviewers_claim_is_refused_but_a_superuser_may(pending, rita, rob, root) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    with pytest.raises(ActionError) as refused:
        approval_release(approval_id=approval.pk, user=rob)
    assert (refused.value.status, refused.value.code) == (409, "not_claimant")
    assert refused.value.detail["claimed_by"] == "rita"
    assert Approval.objects.get(pk=approval.pk).claimed_by == rita
    approval_release(approval_id=approval.pk, user=root)
    assert Approval.objects.get(pk=approval.pk).claimed_by is None
    assert claim_rows(approval) == [("rita", "released")]


def test_logging_out_ends_every_claim_of_the_reviewer(pending, rita, rob, as_user) -> None:
    first, second, theirs = pending(), pending(), pending()
    client = as_user(rita)
    post(client, first, "claim")
    post(client, second, "claim")
    approval_claim(approval_id=theirs.pk, user=rob)
    assert client.post("/logout/", headers={"X-CSRFToken": client.token()}).status_code == 302
    assert Approval.objects.filter(claimed_by=rita).count() == 0
    assert claim_rows(first) == claim_rows(second) == [("rita", "logout")]
    assert claim_rows(theirs) == [("rob", "")]  # only the one who left lets go


# -- lapsing ---------------------------------------------------------------------------


def test_a_lapsed_claim_is_no_claim_before_anyone_records_it(pending, rita, rob, as_user, api) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    lapse(approval)
    # Nobody swept yet: the row still names rita, yet every reader treats it as absent.
    assert Approval.objects.get(pk=approval.pk).claimed_by == rita
    body = api("rob").get("/api/approvals?status=pending").data["items"][0]
    assert (body["claimed_by"], body["claimed_until"]) == (None, None)
    assert "Claimed by" not in card_html(as_user(rob), approval)
    # Rob may take it now: rita's claim is recorded lapsed, at its time, once.
    approval_claim(approval_id=approval.pk, user=rob)
    assert claim_rows(approval) == [("rita", "lapsed"), ("rob", "")]
    lapsed = ApprovalClaim.objects.get(approval=approval, user=rita)
    assert lapsed.ended_at == lapsed.until


def test_a_claim_lapses_after_the_setting(pending, rita, settings) -> None:
    settings.AIRLOCK_CLAIM_MINUTES = 0.5
    approval = pending()
    until = approval_claim(approval_id=approval.pk, user=rita).claimed_until
    assert until is not None and until - timezone.now() <= dt.timedelta(seconds=30)
    assert claims_lapse(now=until - dt.timedelta(seconds=1)) == 0
    assert claims_lapse(now=until + dt.timedelta(seconds=1)) == 1
    a = Approval.objects.get(pk=approval.pk)
    assert (a.claimed_by, a.claimed_until) == (None, None)
    assert claim_rows(approval) == [("rita", "lapsed")]


def test_the_sweeper_records_a_lapse_once_and_keeps_a_newer_claim(pending, rita, rob) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    lapse(approval)
    assert sweep()["lapsed_claims"] == 1
    assert sweep()["lapsed_claims"] == 0
    assert claim_rows(approval) == [("rita", "lapsed")]
    approval_claim(approval_id=approval.pk, user=rob)
    assert sweep()["lapsed_claims"] == 0
    assert Approval.objects.get(pk=approval.pk).claimed_by == rob


def test_a_reviewer_whose_own_claim_lapsed_starts_a_new_one(pending, rita) -> None:
    approval = pending()
    approval_claim(approval_id=approval.pk, user=rita)
    lapse(approval)
    approval_claim(approval_id=approval.pk, user=rita)
    assert claim_rows(approval) == [("rita", "lapsed"), ("rita", "")]


# -- the API ---------------------------------------------------------------------------


def test_the_api_claims_shows_and_releases(pending, api, rita) -> None:
    approval = pending()
    response = api("rita").post(f"/api/approvals/{approval.pk}/claim")
    assert response.status_code == 200
    assert response.data["claimed_by"] == "rita" and response.data["claimed_until"]
    listed = api("rob").get("/api/approvals?status=pending").data["items"][0]
    assert listed["claimed_by"] == "rita" and listed["claimed_until"] == response.data["claimed_until"]
    response = api("rita").post(f"/api/approvals/{approval.pk}/release")
    assert response.status_code == 200 and (response.data["claimed_by"], response.data["claimed_until"]) == (None, None)


def test_the_api_answers_409s_that_say_who_holds_the_claim(pending, api, rita) -> None:
    approval = pending()
    until = api("rita").post(f"/api/approvals/{approval.pk}/claim").data["claimed_until"]
    response = api("rob").post(f"/api/approvals/{approval.pk}/claim")
    assert response.status_code == 409 and response.data["error"] == "claimed"
    assert response.data["detail"]["claimed_by"] == "rita"
    assert dt.datetime.fromisoformat(response.data["detail"]["claimed_until"]) == dt.datetime.fromisoformat(until)
    response = api("rob").post(f"/api/approvals/{approval.pk}/release")
    assert response.status_code == 409 and response.data["error"] == "not_claimant"
    assert "you hold no claim" in response.data["detail"]["message"]
    assert api("root").post(f"/api/approvals/{approval.pk}/release").status_code == 200


def test_the_api_refuses_what_it_should(pending, api, users) -> None:
    approval = pending(user=users["lena"])
    assert api("otto").post(f"/api/approvals/{approval.pk}/claim").status_code == 403
    assert api("leo").post(f"/api/approvals/{approval.pk}/claim").status_code == 404
    assert api(None).post(f"/api/approvals/{approval.pk}/claim").status_code == 401
    assert api("rita").post("/api/approvals/999999/claim").status_code == 404
    assert api("rita").get(f"/api/approvals/{approval.pk}/claim").status_code == 405
    approval_decide(approval_id=approval.pk, user=users["rob"], decision="approve")
    response = api("rita").post(f"/api/approvals/{approval.pk}/claim")
    assert response.status_code == 409 and response.data["error"] == "not_pending"


# -- races -----------------------------------------------------------------------------


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_two_reviewers_claiming_at_once_leave_one_holder(pending, rita, rob) -> None:
    for _ in range(5):
        approval = pending()

        def take(user: User, approval_id: int = approval.pk) -> str:
            try:
                approval_claim(approval_id=approval_id, user=user)
                return "won"
            except ActionError as exc:
                return exc.code

        outcomes = at_once(take, [rita, rob, rita, rob])
        holder = Approval.objects.get(pk=approval.pk).claimed_by
        assert holder is not None
        # The holder's own second try extends its claim; the other's both lose.
        assert sorted(outcomes) == ["claimed", "claimed", "won", "won"], outcomes
        open_ = ApprovalClaim.objects.filter(approval=approval, ended_at__isnull=True)
        assert [c.user for c in open_] == [holder]
        approval_decide(approval_id=approval.pk, user=holder, decision="reject")


# -- the poll --------------------------------------------------------------------------


def test_the_poll_sends_a_kept_cards_claim_line_when_the_claim_changed(pending, rita, rob, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    page = client.get("/reviews/").content.decode()
    token = re.search(rf'name="claim" value="({approval.pk}:[^"]+)"', page)
    assert token and token.group(1) == f"{approval.pk}:-"
    poll = f"/reviews/list/?shown={approval.pk}&claim={token.group(1)}"

    def oob() -> str:
        body = client.get(poll, headers=HTMX).content.decode()
        found = re.search(rf'<div class="claim[^"]*" id="approval-{approval.pk}-claim" hx-swap-oob="true">.*?</div>', body, re.S)
        return found.group(0) if found else ""

    assert oob() == ""  # nothing changed: the kept card is left alone
    approval_claim(approval_id=approval.pk, user=rob)
    line = oob()
    assert 'Claimed by <strong class="who">rob</strong>' in line and "Claim</button>" not in line
    # Rob's claim lapses: the line comes again, free to claim.
    lapse(approval)
    fresh = Approval.objects.get(pk=approval.pk)
    poll = f"/reviews/list/?shown={approval.pk}&claim={approval.pk}:{fresh.claimed_by_id}.{int(fresh.claimed_until.timestamp() * 1000)}"
    line = oob()
    assert "Claimed by" not in line and ">Claim</button>" in line
