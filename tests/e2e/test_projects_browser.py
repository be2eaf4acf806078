"""The project switcher in a real browser: a reviewer of two projects narrows the queue,
the badge and the runs list to one, a link to the other project's run still opens, and
"All projects" brings both back."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from agents.models import Membership
from tests.helpers import PASSWORD, member

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_reviewer_of_two_projects_switches_between_them(new_page, login, teams, pending) -> None:
    robin = member("robin", teams["support"].project, "reviewer")
    Membership.objects.create(project=teams["finance"].project, user=robin, role="reviewer")
    support = pending(user=teams["support"]["launcher"], agent="support-bot")
    finance = pending(user=teams["finance"]["launcher"], agent="finance-bot")
    page, watch = new_page()
    login(page, "robin", PASSWORD)
    page.goto("/reviews/")
    cards = page.locator("article.card")
    expect(cards).to_have_count(2)

    page.get_by_label("Project").select_option(label="Support")
    page.get_by_role("button", name="Switch").click()
    page.wait_for_url(re.compile(r"/reviews/\?project=support$"))
    expect(cards).to_have_count(1)
    expect(page.locator(f'[data-approval-id="{support.pk}"]')).to_be_visible()
    expect(page.locator("#nav-badge")).to_have_attribute("data-count", "1")

    # The switch is remembered: the runs list shows support's run alone.
    page.get_by_role("link", name="Runs", exact=True).click()
    expect(page.locator(f'a[href="/runs/{support.run_id}/"]').first).to_be_visible()
    expect(page.locator(f'a[href="/runs/{finance.run_id}/"]')).to_have_count(0)
    expect(page.get_by_label("Project")).to_have_value("support")

    # A link to the other project's run keeps working across the switch.
    page.goto(f"/runs/{finance.run_id}/")
    expect(page.locator("h1")).to_contain_text(f"{finance.run_id}")

    page.get_by_label("Project").select_option(label="All projects")
    page.get_by_role("button", name="Switch").click()
    page.goto("/reviews/")
    expect(cards).to_have_count(2)

    assert not watch.console_errors, watch.console_errors
    # A slug of no project of robin's is answered clearly (the browser logs the 404).
    response = page.goto("/runs/?project=payroll")
    assert response is not None and response.status == 404
    expect(page.locator("main")).to_contain_text("You are not a member of a project named payroll")
    expect(page.get_by_role("link", name="Support")).to_have_attribute("href", "/runs/?project=support")


CONTRAST = """([fg, bg]) => {
  const rgb = s => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = c => { const [r, g, b] = rgb(c).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
  return (a + 0.05) / (b + 0.05);
}"""


def test_the_project_switcher_is_styled_for_the_dark_bar(new_page, login, teams, screenshot) -> None:
    """#47, item 6: an unstyled native select (white) with a label in the bar's own colour."""
    robin = member("robin", teams["support"].project, "reviewer")
    Membership.objects.create(project=teams["finance"].project, user=robin, role="reviewer")
    page, _watch = new_page()
    login(page, "robin", PASSWORD)
    page.goto("/reviews/")
    bar = page.get_by_role("navigation", name="Main")
    bar_bg = bar.evaluate("e => getComputedStyle(e).backgroundColor")
    select, label = page.get_by_label("Project"), bar.locator("label[for=project-switch]")
    select_bg = select.evaluate("e => getComputedStyle(e).backgroundColor")
    assert select_bg != "rgb(255, 255, 255)" and select.evaluate("e => getComputedStyle(e).appearance") == "none"
    # Readable: the label on the bar, the choice on the select (WCAG AA, 4.5:1).
    assert page.evaluate(CONTRAST, [label.evaluate("e => getComputedStyle(e).color"), bar_bg]) >= 4.5
    assert page.evaluate(CONTRAST, [select.evaluate("e => getComputedStyle(e).color"), select_bg]) >= 4.5
    # Dark like the bar it sits in, not a light box on it.
    assert page.evaluate(CONTRAST, ["rgb(255, 255, 255)", select_bg]) >= 7
    screenshot(page, "project-switcher")
