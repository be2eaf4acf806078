"""Decisions beyond yes/no in a real browser: edit then approve, the vote counter, the
countdown to expiry. The test drives runs itself, as a worker would."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from agents.models import Approval, LedgerEntry, Run
from tests.e2e.test_reviews_queue import POLL, open_queue
from tests.helpers import call, final, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}


def waiting(launch, drive, **policy: Any) -> Approval:
    policy.setdefault("rules", [TWO_PEOPLE])
    run = drive(launch([call("ledger_write", entry="pay ACME 100"), final("paid")], task="Pay ACME", policy=policy))
    assert run.state == "awaiting_approval", run.error
    return Approval.objects.pending().get(run=run)


def test_a_reviewer_edits_the_arguments_then_approves(new_page, login, screenshot, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    approval = waiting(launch, drive, rules=[{**TWO_PEOPLE, "approvals": 1}])
    page, watch = open_queue(new_page, login, "rita")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    editor = card.get_by_label("Arguments to run instead")
    expect(editor).to_be_hidden()
    card.get_by_role("button", name="Edit arguments").click()
    expect(editor).to_be_visible()
    expect(editor).to_be_enabled()
    expect(card.get_by_role("button", name="Approve", exact=True)).to_be_hidden()
    editor.fill(json.dumps({"entry": "pay ACME 90"}))
    card.get_by_label("Note to the agent").fill("the invoice says 90")
    screenshot(page, "review-card-edit")
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(card.locator(".decision")).to_contain_text("Approved by rita")
    expect(card.locator(".edited")).to_contain_text('"entry": "pay ACME 90"')
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done"
    assert [e.entry for e in LedgerEntry.objects.filter(run=run)] == ["pay ACME 90"]
    assert not watch.console_errors, watch.console_errors


def test_a_refused_edit_keeps_the_editor_open_with_the_reason(new_page, login, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    approval = waiting(launch, drive, rules=[{**TWO_PEOPLE, "approvals": 1}])
    page, _ = open_queue(new_page, login, "rita")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    card.get_by_role("button", name="Edit arguments").click()
    card.get_by_label("Arguments to run instead").fill('{"entry": "pay", "amount": 5}')
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(card.get_by_role("alert")).to_contain_text("Not approved: invalid_arguments")
    expect(card.get_by_label("Arguments to run instead")).to_have_value('{"entry": "pay", "amount": 5}')
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    # The editor is open, so its toggle offers to close it, not to open it again (#47).
    expect(card.get_by_role("button", name="Edit arguments")).to_have_count(0)
    toggle = card.get_by_role("button", name="Cancel edit")
    expect(toggle).to_have_attribute("aria-expanded", "true")
    toggle.click()
    expect(card.get_by_label("Arguments to run instead")).to_be_hidden()
    expect(card.get_by_role("button", name="Edit arguments")).to_be_visible()
    expect(card.get_by_role("button", name="Approve", exact=True)).to_be_visible()


def test_the_quorum_counter_counts_each_reviewer_once(new_page, login, screenshot, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    person("rob", "reviewer")
    approval = waiting(launch, drive)
    rita, _ = open_queue(new_page, login, "rita")
    rob, _ = open_queue(new_page, login, "rob")
    mine = rita.locator(f'[data-approval-id="{approval.pk}"]')
    expect(mine.locator(".quorum")).to_have_text("0 of 2 approvals")
    mine.get_by_role("button", name="Approve", exact=True).click()
    expect(mine.locator(".quorum")).to_have_text("1 of 2 approvals: rita (approve)")
    expect(mine.locator(".voted")).to_contain_text("You already voted (approve); waiting for 1 more approval")
    expect(mine.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    screenshot(rita, "review-card-one-of-two")

    # Rob's page keeps its card as it is between polls; its counter follows rita's vote.
    theirs = rob.locator(f'[data-approval-id="{approval.pk}"]')
    expect(theirs.locator(".quorum")).to_have_text("1 of 2 approvals: rita (approve)", timeout=POLL)
    theirs.get_by_role("button", name="Approve", exact=True).click()
    expect(theirs.locator(".decision")).to_contain_text("Approved by rob")
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1


def test_the_card_counts_down_and_is_marked_in_the_last_fifth(new_page, login, screenshot, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    approval = waiting(launch, drive, approval_timeout_seconds=50)
    # 12 s of 50 left: not yet the last fifth (10 s); the page's clock crosses it.
    now = timezone.now()
    Approval.objects.filter(pk=approval.pk).update(
        created_at=now - dt.timedelta(seconds=38), expires_at=now + dt.timedelta(seconds=12)
    )
    page, watch = open_queue(new_page, login, "rita")
    expires = page.locator(f'[data-approval-id="{approval.pk}"] .expires')
    expect(expires).to_contain_text(re.compile(r"expires in 1\d s"))
    expect(expires).not_to_have_class(re.compile("expiring"))
    first = expires.inner_text()
    expect(expires).not_to_have_text(first)  # the clock moves
    expect(expires).to_have_class(re.compile("expiring"), timeout=15_000)
    expect(expires).to_contain_text(re.compile(r"expires in \d s"))
    screenshot(page, "review-card-expiring")
    assert not watch.console_errors, watch.console_errors
