"""The error pages in a real browser (#47 item 4): the site's layout, the reason, and a
"Go back" that leads back."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.helpers import PASSWORD, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_reviewer_sent_to_the_launch_form_reads_why_and_goes_back(new_page, login, defaults) -> None:
    person("rita", "reviewer")
    page, watch = new_page()
    login(page, "rita", PASSWORD)
    page.goto("/runs/")
    page.goto("/runs/new/", referer=page.url)  # as a link on the runs page would send it
    expect(page.get_by_role("heading", level=1)).to_contain_text("Not allowed")
    expect(page.locator(".error-reason")).to_have_text("only launchers start runs")
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    page.get_by_role("link", name="Go back").click()
    page.wait_for_url("**/runs/")
    page.goto("/reviews/?after=zzz")
    expect(page.get_by_role("heading", name="Review queue")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("first page of the queue")
    # The list's own URL, opened as a page (a copied "Show more" link): the same page.
    page.goto("/reviews/list/?more=1&after=zzz")
    expect(page.get_by_role("heading", name="Review queue")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("“after=zzz” in the link is not the number of a call")
    page.get_by_role("link", name="Back to the first cards").click()
    page.wait_for_url("**/reviews/")
    expect(page.get_by_role("alert")).to_have_count(0)
    assert not [e for e in watch.console_errors if "status of 40" not in e], watch.console_errors
