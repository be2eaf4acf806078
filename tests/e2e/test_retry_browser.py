"""Retry and fork in a real browser: an operator retries a failed run from its page and
reads the copied history as one collapsed block; a reviewer answers a fork's "already
ran" call with "Reuse that result", and nothing runs again. The test drives runs itself,
as a worker would."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from agents.actions.forks import run_fork
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


def test_a_run_that_failed_on_its_step_budget_is_retried_with_more_steps_and_finishes(
    new_page, login, launch, drive, defaults
) -> None:
    person("otto", "operator")
    script = [call("echo", text="one"), call("echo", text="two"), call("echo", text="three"), final("all three")]
    parent = drive(launch(script, task="Echo three times", limits={"max_steps": 4}))
    assert parent.state == "failed" and "max_steps" in parent.error
    page, watch = new_page()
    login(page, "otto", PASSWORD)
    page.goto(f"/runs/{parent.pk}/")
    # The page shows the run's effective limits and its launch policy, not only its JSON.
    page.get_by_text("Limits and launch policy").click()
    steps = page.locator('#run-limits tr[data-limit="max_steps"]')
    expect(steps.locator(".value")).to_have_text("4")
    expect(steps.locator(".ceiling")).to_have_text("20")
    expect(page.locator("#launch-policy")).to_contain_text("a human reviewer")
    page.get_by_text("Limits for the retry").click()
    page.get_by_label("Steps").fill("12")
    page.get_by_role("button", name="Retry from the last good step").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    child = Run.objects.get(forked_from=parent)
    assert child.engine["limits"]["max_steps"] == 12
    child = drive(child)
    assert child.state == "done" and child.answer == "all three", (child.state, child.error)
    # Retried with the same budget, it would have failed at once (docs/retry.md).
    assert not watch.console_errors, watch.console_errors


def test_a_retry_above_the_profiles_limit_is_refused_with_the_reason(new_page, login, launch, drive, defaults) -> None:
    person("otto", "operator")
    parent = drive(launch([call("echo", text="x")] * 3, limits={"max_steps": 2}))
    assert parent.state == "failed"
    page, _ = new_page()
    login(page, "otto", PASSWORD)
    page.goto(f"/runs/{parent.pk}/")
    page.get_by_text("Limits for the retry").click()
    page.get_by_label("Steps").evaluate("i => i.removeAttribute('max')")  # as a stale form would send it
    page.get_by_label("Steps").fill("500")
    page.get_by_role("button", name="Retry from the last good step").click()
    # Answered on the retry's page, on the field, with the API's words.
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Retry run #{parent.pk}")
    expect(page.locator("#max_steps-error")).to_have_text("max_steps may only tighten the profile's 20, not 500")
    expect(page.get_by_label("Steps")).to_have_value("500")
    assert not Run.objects.filter(forked_from=parent).exists()


def test_an_operator_forks_a_finished_run_from_a_timeline_step(new_page, login, launch, drive, defaults) -> None:
    person("otto", "operator")
    parent = drive(launch([call("echo", text="first"), call("echo", text="second"), final("done")], task="Two echoes"))
    assert parent.state == "done"
    resting = parent.transitions.filter(to_state="planning").order_by("seq").first()
    page, watch = new_page()
    login(page, "otto", PASSWORD)
    page.goto(f"/runs/{parent.pk}/")
    step = page.locator(f"#t{resting.seq}")
    step.get_by_role("link", name="Fork from here").click()
    # The fork's page: the same limits field as the retry's, then the button that forks.
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Fork run #{parent.pk} after step {resting.seq}")
    page.get_by_label("Steps").evaluate("i => i.removeAttribute('max')")  # as a stale form would send it
    page.get_by_label("Steps").fill("500")
    page.get_by_role("button", name="Fork", exact=True).click()
    expect(page.locator("#max_steps-error")).to_have_text("max_steps may only tighten the profile's 20, not 500")
    assert not Run.objects.filter(forked_from=parent).exists()
    page.get_by_label("Steps").fill("12")
    page.get_by_role("button", name="Fork", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    child = Run.objects.get(forked_from=parent)
    assert child.fork_seq == resting.seq and page.url.endswith(f"/runs/{child.pk}/")
    assert child.engine["limits"]["max_steps"] == 12
    expect(page.locator(".messages")).to_contain_text(f"forked as run {child.pk}, from after step {resting.seq}")
    # A step that is not a resting point (a tool call under way) offers no fork.
    acting = parent.transitions.filter(to_state="acting").order_by("seq").first()
    page.goto(f"/runs/{parent.pk}/")
    expect(page.locator(f"#t{acting.seq}").get_by_role("link", name="Fork from here")).to_have_count(0)
    # The refused value's page is a 400, which the browser logs; nothing else may be.
    assert not [e for e in watch.console_errors if "status of 400" not in e], watch.console_errors
