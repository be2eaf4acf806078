"""/reviews/stats/ in Chromium: reached from the navigation, the time-to-decision chart
drawn (inline SVG with its title, no script, nothing blocked by the CSP), its numbers in
a table, and the approval fatigue draft with its way to a backtest."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.helpers import PASSWORD, person
from tests.reviews import rows

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_stats_page_draws_the_chart_and_offers_the_fatigue_draft(new_page, login, screenshot, defaults) -> None:
    rows.three_days_and_a_streak(person("root", superuser=True))
    page, watch = new_page()
    login(page, "root", PASSWORD)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Review stats").click()
    page.wait_for_url("**/reviews/stats/")
    expect(page.get_by_role("heading", name="Review statistics")).to_be_visible()

    chart = page.get_by_role("img", name="Time to decision per day")
    expect(chart).to_be_visible()
    assert chart.locator("polyline.p50").get_attribute("points")
    assert page.locator("#decision-chart circle.p50").count() >= 3
    page.get_by_text("The chart's numbers").click()
    expect(page.locator("#chart-table tbody tr")).to_have_count(8)

    streak = page.locator("article.streak")
    expect(streak).to_contain_text("the last 20 ledger_write calls that rule 1 of the profile asked about")
    draft = json.loads(streak.locator("pre.draft").inner_text())
    assert draft["mode"] == "shadow" and draft["then"] == "allow" and draft["tool"] == "ledger_write"
    screenshot(page, "review-stats")
    assert not watch.console_errors, watch.console_errors

    streak.get_by_role("link", name="Backtest this draft as a shadow rule").click()
    page.wait_for_url("**/backtest/?policy=*")
    offered = json.loads(page.locator("textarea[name=policy]").input_value())
    assert offered["rules"][0] == draft
