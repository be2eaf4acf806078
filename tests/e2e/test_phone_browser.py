"""Airlock on a phone (issue 25 item 6): at 320 and 390 px wide no page scrolls
sideways (the queue, a card with its editor open, the approval's own page, the runs
list, the timeline, the launch form), a card's buttons stay on screen with its editor
open, and the highlighted planted instruction is in view without scrolling its box.

Screenshots of each page at each width land in test-output/ (phone-<width>-<page>.png).
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from agents.demo import PLANTED_INSTRUCTION, SCENARIOS
from agents.models import Approval
from tests.helpers import PASSWORD, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

OVERFLOW = "[document.documentElement.scrollWidth, window.innerWidth]"
# The outermost elements reaching past the window's right edge, to name in a failure.
TOO_WIDE = """() => Array.from(document.querySelectorAll("body *"))
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5
    && !(e.parentElement && e.parentElement.getBoundingClientRect().right > window.innerWidth + 0.5))
  .slice(0, 5)
  .map(e => e.tagName.toLowerCase() + (e.className ? "." + String(e.className).split(" ").join(".") : "")
    + " " + Math.round(e.getBoundingClientRect().width) + "px")"""


def no_sideways_scroll(page: Any, what: str) -> None:
    scroll_width, inner_width = page.evaluate(OVERFLOW)
    assert scroll_width <= inner_width, (
        f"{what}: the page is {scroll_width} px wide in a {inner_width} px window; too wide: {page.evaluate(TOO_WIDE)}"
    )


@pytest.mark.parametrize("width", [320, 390])
def test_pages_fit_a_phone_screen(width, launch, drive, defaults, new_page, login, screenshot) -> None:
    person("rita", "reviewer", superuser=True)
    scenario = next(s for s in SCENARIOS if s["name"] == "customer-question")
    run = drive(launch(None, agent=scenario["agent"], task=scenario["task"]))
    approval = Approval.objects.get(run=run, status="pending")

    page, watch = new_page()
    page.set_viewport_size({"width": width, "height": 800})
    login(page, "rita", PASSWORD)

    page.goto("/reviews/")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    expect(card.get_by_role("button", name="Reject")).to_be_visible()
    no_sideways_scroll(page, "the queue")
    # The planted passage is in view inside its box, not below the box's fold.
    box = card.locator(".untrusted-text")
    mark = box.locator("mark.suspect")
    expect(mark).to_have_text(PLANTED_INSTRUCTION)
    top = mark.evaluate(
        "m => { const box = m.closest('pre'); return m.getBoundingClientRect().top - box.getBoundingClientRect().top; }"
    )
    box_height = box.evaluate("b => b.clientHeight")
    assert 0 <= top < box_height, (top, box_height)
    screenshot(page, f"phone-{width}-queue")

    card.get_by_role("button", name="Edit arguments").click()
    expect(card.get_by_label("Arguments to run instead")).to_be_visible()
    for name in ("Approve with these arguments", "Reject", "Cancel edit"):
        left, right = card.get_by_role("button", name=name).evaluate(
            "b => [b.getBoundingClientRect().left, b.getBoundingClientRect().right]"
        )
        assert 0 <= left and right <= width, (name, left, right)  # not cut off at either side
    no_sideways_scroll(page, "a card with its editor open")
    screenshot(page, f"phone-{width}-card-edit")
    card.get_by_role("button", name="Cancel edit").click()
    card.get_by_role("button", name="Reject").click()
    expect(card.locator(".decision")).to_contain_text("Rejected by rita")
    drive(run)
    page.goto(f"/reviews/{approval.pk}/")  # where every notification links
    expect(page.locator(f'[data-approval-id="{approval.pk}"]')).to_be_visible()
    no_sideways_scroll(page, "the approval's own page")
    screenshot(page, f"phone-{width}-approval")

    page.goto("/runs/")
    expect(page.locator("table.runs")).to_be_visible()
    no_sideways_scroll(page, "the runs list")
    screenshot(page, f"phone-{width}-runs")

    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("table.approvals")).to_be_visible()
    no_sideways_scroll(page, "the timeline")
    screenshot(page, f"phone-{width}-timeline")

    page.goto("/runs/new/")
    page.get_by_text("Tighter limits (optional)").click()
    page.get_by_text("Tighter policy (optional)").click()
    no_sideways_scroll(page, "the launch form")
    screenshot(page, f"phone-{width}-launch")
    assert not watch.console_errors, watch.console_errors


@pytest.mark.parametrize("width", [320, 390])
def test_the_review_stats_fit_a_phone_screen(width, defaults, new_page, login, screenshot) -> None:
    """#47, item 6: /reviews/stats/ was 666 px wide in a 390 px window."""
    from tests.reviews import rows

    rows.three_days_and_a_streak(person("root", superuser=True))
    page, _watch = new_page()
    page.set_viewport_size({"width": width, "height": 800})
    login(page, "root", PASSWORD)
    page.goto("/reviews/stats/")
    expect(page.get_by_role("img", name="Time to decision per day")).to_be_visible()
    page.get_by_text("The chart's numbers").click()
    no_sideways_scroll(page, "the review stats")
    screenshot(page, f"phone-{width}-stats")
