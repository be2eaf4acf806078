"""Hostile text from a model or a tool is shown as text, in Chromium, on every page.

Each payload goes in as a run's task, a fetched page (tainted content), a tool's
arguments, a reviewer's note and the final answer; one more is the name of a tool the
model asks for. The pages
must show each one character for character (read back with inner_text) while no script
runs (no dialog), nothing loads from another origin, htmx finds nothing to act on and
the browser reports no CSP violation (the `new_page` fixture fails on any of those).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import expect

from agents.actions.approvals import approval_decide
from agents.models import Approval, Message, Run
from agents.runs import driver
from tests.helpers import PASSWORD as PW
from tests.helpers import call, final

pytestmark = [pytest.mark.e2e, pytest.mark.reliability, pytest.mark.django_db(transaction=True)]

PAYLOADS = [
    '<script>alert("xss-script")</script>',
    "<img src=x onerror=\"alert('xss-img')\">",
    '<div hx-get="https://evil.example/h" hx-trigger="load">hx</div>',
    "<a href=\"javascript:alert('xss-link')\">click me</a>",
    '{"a": "</script><script>alert(1)</script>"}',
    "![x](https://evil.example/x.png)",
    '<img src="https://evil.example/beacon.png">',
]
HOSTILE_TOOL = "<img src=x onerror=alert('tool')>"

# Anything that would mean the payload became markup.
LIVE_MARKUP = ", ".join(
    [
        "img[src='x']",
        "img[src*='evil']",
        "[onerror]",
        "[hx-trigger='load'][hx-get^='http']",  # our nav badge loads itself from a path
        "[hx-get*='evil']",
        "a[href^='javascript']",
        "script:not([src])",
    ]
)


def inert(page: Any) -> None:
    assert page.locator(LIVE_MARKUP).count() == 0, page.url


def hostile_runs(launch, drive, people) -> list[Approval]:
    approvals = []
    for p in PAYLOADS:
        run = drive(launch([call("fetch_fixture", text=p), call("ledger_write", entry=p), final(p)], task=p))
        assert run.state == "awaiting_approval", run.error
        approvals.append(Approval.objects.get(run=run, status="pending"))
    return approvals


def test_hostile_text_is_shown_verbatim_and_stays_inert(new_page, login, launch, drive, people, screenshot) -> None:
    approvals = hostile_runs(launch, drive, people)
    odd = drive(launch([call(HOSTILE_TOOL, x=1), final("x")], task="a tool with a hostile name"))
    assert odd.state == "done"  # the profile has no such tool: refused, as a tool result

    page, watch = new_page()
    login(page, "root", PW)

    # 1. The review queue: arguments, the untrusted content, the task; then one poll.
    page.goto("/reviews/")
    for approval, p in zip(approvals, PAYLOADS, strict=True):
        card = page.locator(f'[data-approval-id="{approval.pk}"]')
        assert json.loads(card.locator("pre.json").inner_text()) == {"entry": p}
        assert card.locator(".untrusted-text").inner_text() == p
        assert card.locator(".task dd").inner_text() == p
    with page.expect_response(lambda r: "/reviews/list/" in r.url):
        pass  # the queue's own poll swaps the list in again through htmx
    page.wait_for_load_state("networkidle")
    inert(page)
    screenshot(page, "security-xss-queue")

    # 2. A reviewer's note carrying a payload, typed in the browser: htmx swaps in the
    # decided card with the note; the other notes are given server-side.
    notes = {a.pk: p for a, p in zip(approvals, PAYLOADS, strict=True)}
    first = page.locator(f'[data-approval-id="{approvals[0].pk}"]')
    notes[approvals[0].pk] = PAYLOADS[1]
    first.locator("textarea[name=note]").fill(PAYLOADS[1])
    first.get_by_role("button", name="Reject").click()
    expect(first.locator(".decision-note")).to_contain_text(PAYLOADS[1])
    assert first.locator(".decision-note").inner_text().endswith(PAYLOADS[1])
    inert(page)
    for approval in approvals[1:]:
        approval_decide(approval_id=approval.pk, user=people["reviewer"], decision="reject", note=notes[approval.pk])
    for approval in approvals:
        assert driver.drive(approval.run_id).state == "done"

    # 3. Each timeline: task, answer, fetched text, arguments, the note.
    for approval, p in zip(approvals, PAYLOADS, strict=True):
        run = Run.objects.get(pk=approval.run_id)
        page.goto(f"/runs/{run.pk}/")
        expect(page.locator("[data-state]").first).to_have_text("done")
        assert page.locator(".run-header .task pre").inner_text() == p
        assert page.locator(".run-header .answer pre").inner_text() == p
        fetched = Message.objects.get(run=run, role="tool", name="fetch_fixture").content
        assert p in fetched
        assert page.locator(".msg-tool pre").first.inner_text() == fetched
        args = [json.loads(t) for t in page.locator(".msg-assistant .call pre").all_inner_texts()]
        assert args == [{"text": p}, {"entry": p}]
        note = notes[approval.pk]
        assert page.locator(f'tr[data-approval-id="{approval.pk}"] td').last.inner_text() == note
        assert page.locator(".decision").inner_text().endswith(f"“{note}” (via dashboard)")
        inert(page)

    page.goto(f"/runs/{odd.pk}/")
    assert page.locator(".call-name code").first.inner_text() == HOSTILE_TOOL
    inert(page)

    # 4. The overview and the run list: the task lines.
    for url, cell in (("/", ".task-line"), ("/runs/", ".task, .task-line")):
        page.goto(url)
        shown = page.locator(cell).all_inner_texts()
        for p in PAYLOADS:
            assert p in shown, (url, p, shown)
        inert(page)
    assert watch.dialogs == [] and watch.foreign_requests == [] and watch.csp_violations == []
