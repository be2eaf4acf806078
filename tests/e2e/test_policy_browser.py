"""Argument rules in a real browser: the card names the rule that asked, and "Approve
and allow for this run" lets the tool's later calls through.

Workers are not part of these tests: the test drives the run itself with
`agents.runs.driver.drive`, as a worker would.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from agents.models import AgentProfile, Approval, Grant, Run
from tests.helpers import call, final, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PW = "correct horse battery"
RULES = [
    {"tool": "ledger_write", "when": {"arg": "entry.amount", "op": "lt", "value": 20}, "then": "allow",
     "reason": "small entries need no human"},
    {"tool": "ledger_write", "then": "ask", "reason": "entries of 20 or more need a human"},
]


def test_the_rule_that_asked_is_on_the_card_and_a_grant_lets_the_next_call_through(
    new_page, login, screenshot, launch, drive, defaults
) -> None:
    person("rita", "reviewer")
    AgentProfile.objects.filter(name="scripted").update(rules=RULES)
    script = [call("ledger_write", entry={"amount": a}) for a in (5, 50, 70)] + [final("booked")]
    run = drive(launch(script, task="Book three ledger entries"))
    assert run.state == "awaiting_approval" and run.ledger.count() == 1  # 5 went through by rule 1
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.args == {"entry": {"amount": 50}}

    page, watch = new_page()
    login(page, "rita", PW)
    page.goto("/reviews/")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    expect(card.locator(".reason dd")).to_have_text("rule 2 of the profile: entries of 20 or more need a human")
    screenshot(page, "review-queue-rule")
    card.get_by_role("button", name="Approve and allow for this run", exact=True).click()
    expect(card.locator(".decision")).to_contain_text("Approved by rita")

    grant = Grant.objects.get(run=run)
    assert (grant.tool, grant.args, grant.by.username) == ("ledger_write", None, "rita")
    run = drive(Run.objects.get(pk=run.pk))
    assert run.state == "done" and run.ledger.count() == 3  # 70 was let through by the grant
    assert not Approval.objects.filter(run=run, status="pending").exists()

    page.goto(f"/runs/{run.pk}/")
    expect(page.locator(".grant-line")).to_have_text(
        "Grant 1: any ledger_write call is allowed for the rest of the run."
    )
    expect(page.locator(".verdict-allow .rule")).to_have_text(["rule 1 of the profile"])
    expect(page.locator(".verdict-allow").last).to_contain_text(
        "grant 1 by rita allows any ledger_write call for this run (else: rule 2 of the profile: entries of 20"
    )
    expect(page.locator("table.grants")).to_contain_text("any ledger_write call")
    screenshot(page, "run-timeline-grant")
    assert not watch.console_errors, watch.console_errors
