"""Accessibility: axe-core on every page as each role, and what axe cannot see (focus,
the keyboard, live regions, contrast of the focus ring, reflow at 320 px).

`/admin/` is Django's and `/api/docs` is Swagger UI as shipped: both are developer
tools outside this promise (docs/api.md says so), so they are not audited here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from agents.actions.approvals import approval_decide
from agents.models import Approval
from tests.helpers import PASSWORD, USERNAMES, call, final

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

POLL = 10_000  # ms: a bound on waiting for a poll, not a measurement
AXE = Axe()


def violations(page: Any) -> list[str]:
    """axe's violations on the page as it is now, one line each with the elements."""
    results = AXE.run(page)
    return [
        f"{v['id']} ({v['impact']}) on {page.url}: " + ", ".join(str(n["target"]) for n in v["nodes"])
        for v in results.response["violations"]
    ]


def opened(new_page: Callable[[], tuple[Any, Any]], login: Callable[..., None], username: str, path: str) -> Any:
    """A fresh browser page, logged in as `username`, at `path`."""
    page, _ = new_page()
    login(page, username, PASSWORD)
    page.goto(path)
    return page


def card(page: Any, approval: Approval) -> Any:
    return page.locator(f'[data-approval-id="{approval.pk}"]')


def settled(page: Any) -> None:
    # The nav badge arrives by htmx after load; audit the page as the reader meets it.
    if page.locator("nav.topnav").count():
        page.locator("#nav-badge[data-count]").wait_for(state="attached")


@pytest.mark.parametrize("role", ["anonymous", "launcher", "operator", "reviewer", "superuser"])
def test_every_page_passes_axe_as_each_role(role, new_page, login, pending, launch, drive, people, rob) -> None:
    lena = people["launcher"]
    # A run of each kind the timeline draws: waiting for a human (live), done, failed.
    waiting = pending(user=lena)
    done = drive(launch([call("echo", text="hello"), final("said hello")], user=lena))
    failed = drive(launch([call("fail")] * 4, user=lena))
    assert (done.state, failed.state) == ("done", "failed")
    decided = pending(user=lena)
    approval_decide(approval_id=decided.pk, user=rob, decision="reject", note="no")

    page, _ = new_page()
    found: list[str] = []
    if role == "anonymous":
        page.goto("/login/")
        found += violations(page)
        page.get_by_label("Username").fill("nobody")
        page.get_by_label("Password").fill("wrong")
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("alert")).to_be_visible()
        found += violations(page)  # the form with its error
    else:
        login(page, USERNAMES[role], PASSWORD)
        paths = ["/", "/reviews/", "/runs/", "/runs/?state=failed"]
        paths += [f"/runs/{pk}/" for pk in (waiting.run_id, done.pk, failed.pk, decided.run_id)]
        paths += [f"/reviews/{a.pk}/" for a in (waiting, decided)]  # an approval's own page, pending and decided
        if role in ("launcher", "superuser"):
            paths.append("/runs/new/")
        for path in paths:
            page.goto(path)
            settled(page)
            found += violations(page)
        if role in ("launcher", "superuser"):
            page.goto("/runs/new/")
            page.get_by_role("button", name="Launch", exact=True).click()
            expect(page.locator(".error").first).to_be_visible()
            found += violations(page)  # the form with its errors
    assert found == []


def test_a_decided_card_passes_axe_and_keeps_focus(new_page, login, rita, pending) -> None:
    """(a) decided cards' boxes scroll and must be reachable; (b) after a decision
    focus stays on the decided card, so the next Tab continues from there."""
    first = pending()
    second = pending()
    page = opened(new_page, login, "rita", "/reviews/")
    one = card(page, first)
    approve = one.get_by_role("button", name="Approve")
    approve.focus()
    page.keyboard.press("Enter")
    expect(one.locator(".decision")).to_contain_text("Approved by rita")
    expect(one).to_be_focused()
    # The boxes of a decided card are short and scroll: each is a Tab stop of its own.
    page.keyboard.press("Tab")
    expect(one.get_by_role("link").first).to_be_focused()
    page.keyboard.press("Tab")
    expect(one.locator("pre.json")).to_be_focused()
    page.keyboard.press("Tab")
    expect(one.locator("pre.untrusted-text")).to_be_focused()
    assert violations(page) == []
    # Tab onwards reaches the next card's controls, never the top of the page.
    for _ in range(8):
        page.keyboard.press("Tab")
        if page.evaluate(f"!!document.activeElement.closest('#approval-{second.pk}')"):
            break
    assert page.evaluate(f"!!document.activeElement.closest('#approval-{second.pk}')")
    assert Approval.objects.get(pk=second.pk).status == "pending"


def test_shortcuts_act_on_the_focused_card_only_and_can_be_turned_off(new_page, login, rita, pending) -> None:
    first = pending()
    second = pending()
    page = opened(new_page, login, "rita", "/reviews/")
    one = card(page, first)
    two = card(page, second)
    # Off until turned on, so typing never triggers them.
    expect(page.get_by_label("Single-key shortcuts")).not_to_be_checked()
    one.locator("pre.json").focus()
    page.keyboard.press("a")
    expect(one.get_by_role("button", name="Approve")).to_be_enabled()
    assert Approval.objects.filter(status="pending").count() == 2
    page.get_by_label("Single-key shortcuts").check()
    # From a link outside the cards the keys do nothing.
    page.get_by_role("link", name="Runs", exact=True).focus()
    page.keyboard.press("a")
    page.keyboard.press("j")
    expect(one).not_to_be_focused()
    assert Approval.objects.filter(status="pending").count() == 2
    # Focus in the second card: "a" approves that one, not the first.
    two.locator("pre.json").focus()
    page.keyboard.press("a")
    expect(two.locator(".decision")).to_contain_text("Approved by rita")
    assert Approval.objects.get(pk=first.pk).status == "pending"
    # Switched off, the keys are plain keys, and the choice survives a reload.
    page.get_by_label("Single-key shortcuts").uncheck()
    page.reload()
    expect(page.get_by_label("Single-key shortcuts")).not_to_be_checked()
    one.focus()
    page.keyboard.press("a")
    page.keyboard.press("j")
    expect(one).to_be_focused()
    expect(one.get_by_role("button", name="Approve")).to_be_enabled()
    assert Approval.objects.get(pk=first.pk).status == "pending"


def test_the_focus_ring_has_three_to_one_contrast_and_no_card_looks_focused_without_focus(
    new_page, login, rita, pending
) -> None:
    first = pending()
    pending()
    page = opened(new_page, login, "rita", "/reviews/")
    one = card(page, first)
    page.get_by_role("link", name="Runs", exact=True).focus()
    rings = page.evaluate("Array.from(document.querySelectorAll('.card')).map(c => getComputedStyle(c).boxShadow)")
    assert all("3px" not in ring for ring in rings), rings
    one.get_by_role("button", name="Reject").focus()
    ring = one.evaluate("c => getComputedStyle(c).boxShadow")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert contrast(rgb(ring), rgb(background)) >= 3, (ring, background)


def rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(x) for x in re.search(r"rgba?\((\d+), (\d+), (\d+)", css).groups())  # type: ignore[union-attr]
    return r, g, b


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    def luminance(c: tuple[int, int, int]) -> float:
        ch = [v / 255 for v in c]
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_a_filter_applies_on_the_button_not_on_the_first_arrow_key(new_page, login, rita, pending) -> None:
    pending()
    page = opened(new_page, login, "rita", "/reviews/")
    tool = page.get_by_label("Tool")
    tool.focus()
    page.keyboard.press("ArrowDown")
    with page.expect_response(re.compile(r"/reviews/list/")):
        pass  # a poll came and went: time enough for a navigation to have started
    assert page.url.endswith("/reviews/")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/reviews/\?.*tool="))


def test_skip_link_and_current_page_in_the_navigation(new_page, login, otto) -> None:
    page = opened(new_page, login, "otto", "/runs/")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_visible()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Runs", exact=True)).to_have_attribute("aria-current", "page")
    expect(nav.locator("[aria-current]")).to_have_count(1)
    page.goto("/")
    expect(nav.get_by_role("link", name="Overview")).to_have_attribute("aria-current", "page")


def test_the_navigation_reflows_at_320_pixels(new_page, login, root) -> None:
    page, _ = new_page()
    page.set_viewport_size({"width": 320, "height": 640})
    login(page, "root", PASSWORD)
    for path in ("/", "/reviews/", "/runs/"):
        page.goto(path)
        settled(page)
        nav_width = page.evaluate("document.querySelector('nav.topnav').scrollWidth")
        assert nav_width <= 320, (path, nav_width)
        expect(page.get_by_role("button", name="Log out")).to_be_in_viewport()


def test_a_live_timeline_keeps_focus_on_its_links(new_page, login, otto, rita, pending) -> None:
    """(c) the header of a live run is re-sent only when the run moves."""
    approval = pending()
    page = opened(new_page, login, "otto", f"/runs/{approval.run_id}/")
    link = page.get_by_role("link", name="Open the call →")
    link.focus()
    for _ in range(3):  # three polls of the live page
        with page.expect_response(re.compile(r"live=1")):
            pass
    expect(link).to_be_focused()
    approval_decide(approval_id=approval.pk, user=rita, decision="reject")
    expect(page.locator("#run-header .status-rejected")).to_be_visible(timeout=POLL)


def test_pending_count_changes_are_announced_once(new_page, login, rita, pending) -> None:
    """(d) one polite live region says the new count; the badge's count is visible text."""
    pending()
    page = opened(new_page, login, "rita", "/reviews/")
    region = page.locator("#announcer")
    expect(region).to_have_attribute("aria-live", "polite")
    expect(region).to_have_text("")
    pending()
    expect(region).to_have_text("2 calls waiting for review.", timeout=POLL)
    expect(page.locator("#nav-badge")).to_have_text("2 pending")
    # The region is the page's only live one, so the change is said once.
    live = page.locator("[aria-live], [role=status], [role=alert]").filter(has_text="waiting")
    expect(live).to_have_count(1)
