"""The email link's decision page in a real browser (#47 item 4): the taint shown as
the queue's card shows it, buttons that differ in look and in label, and an expired
call's page that says so and offers no buttons."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agents.actions.approvals import approval_expire
from agents.models import Approval, LedgerEntry, Run
from agents.notifications.links import link_create
from tests.helpers import person, tainted_write

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def waiting(launch, drive, **kwargs) -> Approval:  # type: ignore[no-untyped-def]
    run = drive(launch(tainted_write("discount code to all"), **kwargs))
    return Approval.objects.get(run=run, status="pending")


def test_the_link_page_shows_the_flagged_passage_and_two_different_buttons(new_page, screenshot, launch, drive) -> None:
    rita = person("rita", "reviewer")
    approval = waiting(launch, drive)
    token = link_create(user=rita, approval=approval)
    page, watch = new_page()
    page.goto(f"/reviews/links/{token}/")
    taint = page.locator("section.untrusted")
    expect(taint).to_contain_text("Returned by fetch_fixture at step 1")
    expect(taint.locator("mark.suspect")).to_have_count(1)
    expect(page.locator("pre.taint")).to_have_count(0)  # no raw {"call_id": ..., "key": ...}
    assert '"key"' not in page.content()
    approve = page.get_by_role("button", name="Approve: run this call")
    reject = page.get_by_role("button", name="Reject: do not run it")
    expect(approve).to_be_visible()
    expect(reject).to_be_visible()
    look = "b => [getComputedStyle(b).backgroundColor, getComputedStyle(b).color]"
    assert approve.evaluate(look) != reject.evaluate(look)
    screenshot(page, "email-link")
    approve.click()
    expect(page.locator("#link-message")).to_contain_text("You approved this call")
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1
    assert not watch.console_errors, watch.console_errors


def test_an_expired_calls_link_says_it_expired_and_offers_no_buttons(new_page, launch, drive) -> None:
    rita = person("rita", "reviewer")
    approval = waiting(launch, drive, policy={"approval_timeout_seconds": 60})
    token = link_create(user=rita, approval=approval)
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=approval.expires_at.timestamp() + 1)
    page, _ = new_page()
    page.goto(f"/reviews/links/{token}/")
    expect(page.locator("#link-message")).to_contain_text("This call expired")
    expect(page.locator("#link-message")).to_contain_text("nobody answered in time")
    expect(page.get_by_role("button", name="Approve: run this call")).to_have_count(0)
    expect(page.get_by_role("button", name="Reject: do not run it")).to_have_count(0)
    expect(page.locator("h1")).to_contain_text("expired")
