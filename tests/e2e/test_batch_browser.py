"""Groups and batches in a real browser: three similar calls make one group card; the
reviewer checks two and approves them; the page says so and the third still waits."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agents.models import Approval, LedgerEntry, Run
from tests.e2e.test_reviews_queue import PW
from tests.helpers import call, final, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
ONE = {"tool": "ledger_write", "then": "ask", "reason": "refunds need a human"}


def test_a_reviewer_approves_two_of_a_group_of_three(new_page, login, screenshot, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    calls = []
    for n in (1, 2, 3):
        run = drive(launch([call("ledger_write", entry=f"refund order {n}"), final("done")], policy={"rules": [ONE]}))
        calls.append(Approval.objects.pending().get(run=run))
    page, watch = new_page()
    login(page, "rita", PW)
    page.goto("/reviews/")
    page.get_by_label("Group similar calls").check()
    page.get_by_role("button", name="Filter").click()
    assert "group=1" in page.url  # kept in the URL with the other filters
    group = page.locator("article.group")
    expect(group).to_have_count(1)
    count = page.locator("#queue-count")
    expect(count).to_contain_text("3 calls waiting")
    expect(group.get_by_role("heading")).to_contain_text("3 similar calls")
    first, second, third = calls
    group.get_by_label(f"Select call #{first.pk}").check()
    group.get_by_label(f"Select call #{second.pk}").check()
    group.get_by_label("Note").fill("refunds checked against the orders")
    screenshot(page, "review-group-two-checked")
    group.get_by_role("button", name="Approve selected").click()

    results = page.get_by_role("status", name="What the batch did")
    expect(results).to_contain_text("Approve selected: 2 decided.")
    expect(results).to_contain_text(f"#{first.pk} decided: approved")
    expect(results).to_contain_text(f"#{second.pk} decided: approved")
    # The third call still waits: alone now, with its own buttons.
    waiting = page.locator(f'[data-approval-id="{third.pk}"]')
    expect(waiting.get_by_role("button", name="Approve", exact=True)).to_be_visible()
    # The header counts what is left, not what was there before the batch (#47).
    expect(count).to_contain_text("1 call waiting")
    expect(count).to_have_count(1)
    screenshot(page, "review-group-after-batch")

    statuses = {a.pk: Approval.objects.get(pk=a.pk).status for a in calls}
    assert statuses == {first.pk: "approved", second.pk: "approved", third.pk: "pending"}
    for a in (first, second):
        run = drive(Run.objects.get(pk=a.run_id))
        assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1
    assert not watch.console_errors, watch.console_errors
    assert not watch.csp_violations, watch.csp_violations
