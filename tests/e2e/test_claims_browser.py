"""Claims and keyboard triage in a real browser: two reviewers in two browser contexts,
one claims, the other's open queue shows who; with shortcuts on, j then a approves the
focused card and the live region says so, c claims it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from agents.models import Approval, ApprovalClaim
from tests.helpers import PASSWORD, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

POLL = 10_000  # ms: a bound on waiting for the queue's 2 s poll, not a measurement


def open_queue(new_page, login, username: str):
    page, watch = new_page()
    login(page, username, PASSWORD)
    page.goto("/reviews/")
    return page, watch


def card(page, approval: Approval):
    return page.locator(f'[data-approval-id="{approval.pk}"]')


def test_a_claim_shows_on_the_other_reviewers_open_queue(new_page, login, pending, defaults) -> None:
    person("rita", "reviewer")
    person("rob", "reviewer")
    approval = pending()
    ritas, rita_watch = open_queue(new_page, login, "rita")
    robs, rob_watch = open_queue(new_page, login, "rob")
    expect(card(robs, approval)).to_be_visible()
    # Rob starts a note; rita's claim must not take it from him.
    robs_note = card(robs, approval).get_by_label("Note to the agent")
    robs_note.fill("looking at the amount")
    card(ritas, approval).get_by_role("button", name="Claim", exact=True).click()
    expect(card(ritas, approval).locator(".claimed")).to_contain_text("You claimed this until")
    expect(card(ritas, approval).get_by_role("button", name="Release")).to_be_visible()
    claimed = card(robs, approval).locator(".claimed")
    expect(claimed).to_contain_text(re.compile(r"Claimed by rita until \d\d:\d\d"), timeout=POLL)
    expect(card(robs, approval).get_by_role("button", name="Claim", exact=True)).to_have_count(0)
    expect(robs_note).to_have_value("looking at the amount")
    # A claim only tells: rob still decides, and rita's claim ends with it.
    card(robs, approval).get_by_role("button", name="Reject").click()
    expect(card(robs, approval).locator(".decision")).to_contain_text("Rejected by rob")
    assert list(ApprovalClaim.objects.values_list("user__username", "end")) == [("rita", "left")]
    # Rita releases nothing now: the card left her queue by itself.
    expect(card(ritas, approval)).to_have_count(0, timeout=POLL)
    assert not rita_watch.console_errors and not rob_watch.console_errors


def test_keyboard_triage_claims_and_approves_the_focused_card_and_says_so(new_page, login, pending, defaults) -> None:
    person("rita", "reviewer")
    first = pending(task="first")
    second = pending(task="second")
    page, watch = open_queue(new_page, login, "rita")
    expect(card(page, second)).to_be_visible()
    help_ = page.locator("details#shortcuts-help")
    help_.locator("summary").click()
    for key in ("j", "k", "c", "a", "r", "n", "x"):
        expect(help_.locator("kbd", has_text=re.compile(f"^{key}$"))).to_be_visible()
    toggle = page.get_by_label("Single-key shortcuts")
    expect(toggle).not_to_be_checked()
    toggle.check()
    page.evaluate("document.activeElement.blur()")
    live = page.locator("#queue-announce")
    expect(live).to_have_attribute("aria-live", "polite")
    page.keyboard.press("j")
    expect(card(page, first)).to_be_focused()
    page.keyboard.press("c")
    expect(live).to_contain_text(f"Claimed call {first.pk}")
    expect(card(page, first).locator(".claimed")).to_contain_text("You claimed this until")
    expect(card(page, first)).to_be_focused()
    assert Approval.objects.get(pk=first.pk).claimed_by.username == "rita"
    page.keyboard.press("j")
    expect(card(page, second)).to_be_focused()
    page.keyboard.press("a")
    expect(card(page, second).locator(".decision")).to_contain_text("Approved by rita")
    expect(live).to_have_text(f"Approved call {second.pk}")
    assert Approval.objects.get(pk=second.pk).status == "approved"
    assert Approval.objects.get(pk=first.pk).status == "pending"
    # The choice is remembered in this browser.
    page.reload()
    expect(page.get_by_label("Single-key shortcuts")).to_be_checked()
    assert not watch.console_errors, watch.console_errors
