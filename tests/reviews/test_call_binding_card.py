"""The card's answer is bound to the call it showed (issue 34, item 1): its form carries
the call's `args_hash`; a card made stale by another reviewer's edit is refused with
409 `call_changed` and comes back showing the edit and its author."""

from __future__ import annotations

import re

import pytest

from agents.actions.approvals import approval_decide
from agents.models import Approval, LedgerEntry
from tests.helpers import call, final

pytestmark = pytest.mark.django_db

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign refunds"}
ORIGINAL = "refund 10 EUR to customer 1042"
ATTACK = "refund 10000 EUR to IBAN XX00 ATTACKER"


def waiting(pending) -> Approval:
    return pending([call("ledger_write", entry=ORIGINAL), final("refunded")], policy={"rules": [TWO_PEOPLE]})


def hash_on_card(client, approval: Approval) -> str:
    page = client.get("/reviews/").content.decode()
    card = re.search(rf'<article[^>]*data-approval-id="{approval.pk}".*?</article>', page, re.S)
    assert card, page
    found = re.search(r'<input type="hidden" name="args_hash" value="([0-9a-f]{64})">', card.group(0))
    assert found, card.group(0)
    return found.group(1)


def rob_edits(approval: Approval, rob) -> None:
    seen = Approval.objects.get(pk=approval.pk).args_hash
    approval_decide(approval_id=approval.pk, user=rob, decision="approve", args={"entry": ATTACK}, args_hash=seen)


def test_the_card_form_carries_the_hash_of_the_call_it_shows(pending, rita, rob, as_user) -> None:
    approval = waiting(pending)
    client = as_user(rita)
    assert hash_on_card(client, approval) == approval.args_hash
    rob_edits(approval, rob)
    assert hash_on_card(client, approval) == Approval.objects.get(pk=approval.pk).args_hash != approval.args_hash


def test_a_stale_card_is_refused_with_409_and_comes_back_with_the_edit(pending, rita, rob, as_user, drive) -> None:
    approval = waiting(pending)
    client = as_user(rita)
    seen = hash_on_card(client, approval)
    rob_edits(approval, rob)  # between the render and her click
    response = client.decide(approval.pk, "approve", htmx=True, args_hash=seen)

    assert response.status_code == 409
    html = response.content.decode()
    assert "Not recorded: the call changed since this card was shown (rob edited the arguments)" in html
    assert 'Edited by <strong class="who">rob</strong>' in html and ATTACK in html
    assert f'name="args_hash" value="{Approval.objects.get(pk=approval.pk).args_hash}"' in html
    a = Approval.objects.get(pk=approval.pk)
    assert a.status == "pending" and [v.by_name for v in a.current_votes()] == ["rob"]
    run = drive(a.run)
    assert run.state == "awaiting_approval" and not LedgerEntry.objects.filter(run=run).exists()


def test_without_htmx_a_stale_card_lands_on_the_queue_saying_why(pending, rita, rob, as_user) -> None:
    approval = waiting(pending)
    client = as_user(rita)
    seen = hash_on_card(client, approval)
    rob_edits(approval, rob)
    response = client.decide(approval.pk, "reject", args_hash=seen)
    assert response.status_code == 303
    page = client.get(response["Location"]).content.decode()
    assert "Not recorded: the call changed since this card was shown (rob edited the arguments)" in page
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_a_form_without_the_hash_cannot_approve_an_edited_call(pending, rita, rob, as_user) -> None:
    approval = waiting(pending)
    rob_edits(approval, rob)
    response = as_user(rita).decide(approval.pk, "approve", htmx=True)
    assert response.status_code == 409 and ATTACK in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_the_poll_replaces_a_card_whose_call_another_reviewer_edited(pending, rita, rob, as_user) -> None:
    approval = waiting(pending)
    client = as_user(rita)
    seen = hash_on_card(client, approval)
    poll = {"shown": approval.pk, "seen": f"{approval.pk}:{seen}"}
    kept = client.get("/reviews/list/", poll, headers={"HX-Request": "true"}).content.decode()
    assert f'id="approval-{approval.pk}" data-approval-id="{approval.pk}" hx-preserve="true"></article>' in kept

    rob_edits(approval, rob)
    fresh = client.get("/reviews/list/", poll, headers={"HX-Request": "true"}).content.decode()
    card = re.search(rf'<article[^>]*data-approval-id="{approval.pk}".*?</article>', fresh, re.S).group(0)
    assert "hx-preserve" not in card.split(">", 1)[0]  # it replaces the stale card on screen
    assert "The call changed since this card was shown (rob edited the arguments)" in card
    assert ATTACK in card and f'name="args_hash" value="{Approval.objects.get(pk=approval.pk).args_hash}"' in card
