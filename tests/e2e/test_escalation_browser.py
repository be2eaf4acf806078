"""Who reviews and escalation in a real browser (issue 28): the backup group's member
sees no card until the sweeper escalates the call, then the card says so and her click
decides it; the reviewer of another agent never sees it."""

from __future__ import annotations

import datetime as dt

import pytest
from playwright.sync_api import expect

from agents.models import Approval, LedgerEntry, Run
from agents.runs.sweeper import sweep
from tests.e2e.test_reviews_queue import open_queue
from tests.helpers import person, reviewed_profile, tainted_write

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_backup_group_gets_the_call_once_it_is_escalated(new_page, login, pending, drive, defaults) -> None:
    reviewed_profile(escalate_after_seconds=600)
    person("bea", "payments-leads")
    person("rita", "reviewer")
    approval = pending(tainted_write(), agent="payments")
    card = f'[data-approval-id="{approval.pk}"]'

    rita, _ = open_queue(new_page, login, "rita")
    expect(rita.locator(card)).to_have_count(0)
    page, watch = open_queue(new_page, login, "bea")
    expect(page.locator(card)).to_have_count(0)

    Approval.objects.filter(pk=approval.pk).update(created_at=approval.created_at - dt.timedelta(seconds=601))
    assert sweep()["escalated"] == 1
    page.goto("/reviews/")
    expect(page.locator(card)).to_be_visible()
    expect(page.locator(f"{card} .escalated")).to_contain_text("Escalated to payments-leads at")
    page.locator(card).get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator(f"{card} .decision")).to_contain_text("Approved by bea")
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1
    page.goto(f"/runs/{run.pk}/")
    expect(page.locator(".escalated")).to_contain_text("Escalated to payments-leads at")
    rita.reload()
    expect(rita.locator(card)).to_have_count(0)
    assert not watch.console_errors, watch.console_errors
