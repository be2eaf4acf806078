"""A stale card cannot complete someone else's edited call (issue 34, item 1), in a real
browser: the edit lands between the card's render and the reviewer's click; the click is
refused and the card comes back with the edited arguments and who edited them."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agents.actions.approvals import approval_decide
from agents.models import Approval, LedgerEntry, Run
from tests.e2e.test_reviews_queue import POLL, open_queue
from tests.helpers import call, final, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign refunds"}
ORIGINAL = "refund 10 EUR to customer 1042"
ATTACK = "refund 10000 EUR to IBAN XX00 ATTACKER"


def test_a_stale_card_is_refused_and_shows_the_edit_and_who_made_it(
    new_page, login, screenshot, launch, drive, defaults
) -> None:
    person("rita", "reviewer")
    rob = person("rob", "reviewer")
    run = drive(
        launch(
            [call("ledger_write", entry=ORIGINAL), final("refunded")],
            task="Refund order 1042",
            policy={"rules": [TWO_PEOPLE]},
        )
    )
    approval = Approval.objects.pending().get(run=run)
    page, _ = open_queue(new_page, login, "rita")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    expect(card.locator(".args pre")).to_contain_text(ORIGINAL)

    # Her page's poll would replace the card once the call changes: hold it (an empty 204,
    # which htmx leaves alone), so her click lands on the card as it was rendered. Once a
    # held poll went out, none answered by the server is in flight (hx-sync drops overlaps).
    page.route("**/reviews/list/**", lambda route: route.fulfill(status=204))
    with page.expect_request("**/reviews/list/**", timeout=POLL):
        pass
    # Rob edits the call and approves it while Rita's card is open on the original.
    seen = Approval.objects.get(pk=approval.pk).args_hash
    approval_decide(approval_id=approval.pk, user=rob, decision="approve", args={"entry": ATTACK}, args_hash=seen)
    expect(card.locator(".edited")).to_have_count(0)
    expect(card.locator(".args pre")).to_contain_text(ORIGINAL)

    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.locator(".call-changed")).to_contain_text("Not recorded: the call changed", timeout=POLL)
    expect(card.locator(".call-changed")).to_contain_text("rob edited the arguments")
    expect(card.locator(".edited")).to_contain_text("Edited by rob")
    expect(card.locator(".edited pre")).to_contain_text(ATTACK)
    screenshot(page, "review-card-call-changed")
    a = Approval.objects.get(pk=approval.pk)
    assert a.status == "pending" and [v.by_name for v in a.current_votes()] == ["rob"]
    assert not LedgerEntry.objects.filter(run=run).exists()

    # Having seen the edit, her Approve now names the edited call: it decides.
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.locator(".decision")).to_contain_text("Approved by rita", timeout=POLL)
    run = drive(Run.objects.get(pk=run.pk))
    assert run.state == "done"
    assert [e.entry for e in LedgerEntry.objects.filter(run=run)] == [ATTACK]


def test_the_open_card_shows_an_edit_by_itself(new_page, login, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    rob = person("rob", "reviewer")
    run = drive(
        launch(
            [call("ledger_write", entry=ORIGINAL), final("refunded")],
            task="Refund order 1042",
            policy={"rules": [TWO_PEOPLE]},
        )
    )
    approval = Approval.objects.pending().get(run=run)
    page, _ = open_queue(new_page, login, "rita")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    expect(card.locator(".args pre")).to_contain_text(ORIGINAL)
    card.get_by_label("Note to the agent").fill("about the original")

    approval_decide(
        approval_id=approval.pk, user=rob, decision="approve", args={"entry": ATTACK}, args_hash=approval.args_hash
    )
    # The next poll replaces the stale card: the edit, who made it, buttons bound to it.
    expect(card.locator(".call-changed")).to_contain_text("rob edited the arguments", timeout=POLL)
    expect(card.locator(".edited pre")).to_contain_text(ATTACK)
    expect(card.get_by_label("Note to the agent")).to_have_value("")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.locator(".decision")).to_contain_text("Approved by rita", timeout=POLL)
    assert [e.entry for e in LedgerEntry.objects.filter(run=drive(Run.objects.get(pk=run.pk)))] == [ATTACK]
