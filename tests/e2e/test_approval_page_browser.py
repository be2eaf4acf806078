"""/reviews/<id>/ in a real browser: the link a notification carries lands on the call,
past the queue's first page, and its buttons decide it in place (issue 25, item 3)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agents.models import Approval, LedgerEntry, Run
from tests.e2e.test_reviews_queue import open_queue
from tests.helpers import person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_link_of_the_32nd_call_opens_it_and_approve_runs_it_once(
    new_page, login, screenshot, pending, drive, defaults
) -> None:
    person("rita", "reviewer")
    approvals = [pending() for _ in range(32)]
    last = approvals[-1]
    page, watch = open_queue(new_page, login, "rita")
    expect(page.locator("article.card")).to_have_count(25)
    expect(page.locator(f'[data-approval-id="{last.pk}"]')).to_have_count(0)

    page.goto(f"/reviews/{last.pk}/")
    card = page.locator(f'[data-approval-id="{last.pk}"]')
    expect(card).to_be_visible()
    expect(page.get_by_role("link", name="Open the run's timeline →")).to_have_attribute(
        "href", f"/runs/{last.run_id}/"
    )
    screenshot(page, "approval-page")
    approve = card.get_by_role("button", name="Approve", exact=True)
    approve.dblclick()
    expect(page.locator(f'[data-approval-id="{last.pk}"] .decision')).to_contain_text("Approved by rita")
    run = drive(Run.objects.get(pk=last.run_id))
    assert run.state == "done"
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert Approval.objects.get(pk=last.pk).status == "approved"
    page.reload()
    expect(page.locator("h1")).to_contain_text("approved")
    expect(page.locator("tr.vote")).to_contain_text("rita")
    page.get_by_role("link", name="← Review queue").click()
    page.wait_for_url("**/reviews/")
    assert not watch.console_errors, watch.console_errors
