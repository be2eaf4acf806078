"""Retry and fork in a real browser: an operator retries a failed run from its page and
reads the copied history as one collapsed block; a reviewer answers a fork's "already
ran" call with "Reuse that result", and nothing runs again. The test drives runs itself,
as a worker would."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from agents.forks import run_fork
from agents.models import Approval, LedgerEntry, Run
from tests.helpers import PASSWORD, call, final, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_operator_retries_a_failed_run_from_its_page(new_page, login, screenshot, launch, drive, defaults) -> None:
    person("otto", "operator")
    parent = drive(launch([call("ledger_write", entry="invoice 9"), call("echo", text="checked")], task="Pay invoice 9"))
    assert parent.state == "failed"  # the script ran out: the model "failed" after two steps
    page, watch = new_page()
    login(page, "otto", PASSWORD)
    page.goto(f"/runs/{parent.pk}/")
    page.get_by_role("button", name="Retry from the last good step").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    child = Run.objects.get(forked_from=parent)
    assert page.url.endswith(f"/runs/{child.pk}/")
    expect(page.locator("#run-forked-from")).to_contain_text(f"Forked from run #{parent.pk}, after step {child.fork_seq}")
    block = page.locator("#timeline details.forked-history")
    expect(block).to_have_count(1)
    summary = block.locator("summary")
    expect(summary).to_contain_text(f"from run #{parent.pk}, steps 1-{child.fork_seq}")
    # Collapsed: the copied messages are there, out of sight until opened.
    copied = block.locator(".msg")
    expect(copied.first).to_be_hidden()
    summary.click(position={"x": 5, "y": 5})
    expect(copied.first).to_be_visible()
    expect(block).to_contain_text("Pay invoice 9")
    screenshot(page, "retry-fork-timeline")
    summary.get_by_role("link", name=f"run #{parent.pk}").click()
    page.wait_for_url(f"**/runs/{parent.pk}/")
    expect(page.locator("#run-forks")).to_contain_text(f"run #{child.pk}")
    assert LedgerEntry.objects.count() == 1
    assert not watch.console_errors, watch.console_errors


def test_a_reviewer_reuses_the_result_of_a_call_that_already_ran(new_page, login, launch, drive, defaults) -> None:
    person("rita", "reviewer")
    parent = drive(launch([call("ledger_write_unsafe", entry="wire 100 EUR to ACME"), final("wired")], task="Wire ACME"))
    assert parent.state == "done" and LedgerEntry.objects.count() == 1
    child, _ = run_fork(run_id=parent.pk, user=None, from_seq=parent.transitions.get(kind="pickup").seq)
    child = drive(child)
    approval = Approval.objects.get(run=child, status="pending")
    page, watch = new_page()
    login(page, "rita", PASSWORD)
    page.goto(f"/reviews/{approval.pk}/")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    step = parent.transitions.get(kind="tool").seq
    expect(card.locator(".reason")).to_contain_text(f"this exact call already ran in run #{parent.pk} at step {step}")
    expect(card.locator(".prior-result")).to_contain_text('"result": "recorded"')
    expect(card.get_by_role("button", name="Run it again")).to_be_visible()
    expect(card.get_by_role("button", name="Reject")).to_be_visible()
    card.get_by_role("button", name="Reuse that result").click()
    expect(page.locator(f'[data-approval-id="{approval.pk}"] .decision')).to_contain_text("Reused the recorded result")
    assert Approval.objects.get(pk=approval.pk).decision == "reuse"
    assert drive(child).state == "done"
    assert LedgerEntry.objects.count() == 1  # nothing ran again
    page.goto(f"/runs/{child.pk}/")
    expect(page.locator("#timeline .flag-reused")).to_contain_text(f"Reused the result of run #{parent.pk} step {step}")
    assert not watch.console_errors, watch.console_errors
