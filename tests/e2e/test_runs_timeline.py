"""A launcher starts a scripted run from the form and watches its timeline move on its
own: to `awaiting_approval`, then (after a reviewer approves) to `done`.

Workers are another issue's: the test advances the run with `agents.runs.driver.drive`, the
same driver a worker calls, between page assertions.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_launch
from agents.models import AgentProfile, Approval, Run
from agents.runs import driver
from tests.helpers import PASSWORD, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SCRIPT = [
    {
        "call": {"tool": "fetch_fixture", "args": {"text": "Invoice 1042 from ACME: 420.00 EUR, due 2026-12-15."}},
        "usage": {"input_tokens": 1200, "output_tokens": 80},
    },
    {
        "call": {"tool": "ledger_write", "args": {"entry": "ACME invoice 1042: 420.00 EUR"}},
        "usage": {"input_tokens": 1900, "output_tokens": 60},
    },
    {
        "final": "Recorded ACME invoice 1042 (420.00 EUR) in the ledger.",
        "usage": {"input_tokens": 2300, "output_tokens": 40},
    },
]


def test_launcher_watches_a_scripted_run_reach_done_live(defaults, new_page, login, screenshot) -> None:
    AgentProfile.objects.filter(name="scripted").update(price_input_micros=3_000_000, price_output_micros=15_000_000)
    person("lena", "launcher")
    reviewer = person("rita", "reviewer")
    page, watch = new_page()
    login(page, "lena", PASSWORD)

    page.get_by_role("link", name="Launch", exact=True).click()
    expect(page.get_by_role("heading", name="Launch a run")).to_be_visible()
    page.locator("input[name=agent][value=scripted]").check()
    page.get_by_label("Task").fill("Record the ACME invoice in the ledger")
    page.get_by_label("Script (JSON)").fill(json.dumps(SCRIPT))
    page.get_by_role("button", name="Launch", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    assert page.url.endswith(f"/runs/{run.pk}/")
    state = page.locator("#run-header h1 .state")
    expect(state).to_have_text("queued")

    driver.drive(run.pk)  # a worker's turn: fetch, then the write waits for a human
    expect(state).to_have_text("awaiting_approval", timeout=10_000)
    expect(page.locator("#timeline li.step")).to_have_count(5)
    expect(page.get_by_text("This step tainted the run")).to_be_visible()
    expect(page.get_by_text("Waiting for a reviewer")).to_be_visible()

    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.pk, user=reviewer, decision="approve", note="matches the PDF")
    driver.drive(run.pk)
    expect(state).to_have_text("done", timeout=10_000)
    expect(page.locator("#timeline li.step")).to_have_count(Run.objects.get(pk=run.pk).version)
    expect(page.locator(".decision .who")).to_have_text("rita")
    expect(page.locator(f'tr[data-approval-id="{approval.pk}"]')).to_contain_text("rita")
    expect(page.locator(".answer")).to_contain_text("Recorded ACME invoice 1042")
    # the poller stopped: it is still in the page, without a trigger
    expect(page.locator("#poller")).to_have_attribute("data-live", "off")
    assert page.locator("svg.chart polyline").count() == 2
    screenshot(page, "timeline")
    assert not watch.console_errors, watch.console_errors


def test_launch_form_keeps_input_and_shows_errors_inline(defaults, new_page, login, screenshot) -> None:
    person("lena", "launcher")
    page, watch = new_page()
    login(page, "lena", PASSWORD)
    page.goto("/runs/new/")
    # The script box only appears for the scripted agent.
    expect(page.get_by_label("Script (JSON)")).to_be_hidden()
    page.locator("input[name=agent][value=scripted]").check()
    expect(page.get_by_label("Script (JSON)")).to_be_visible()
    page.get_by_label("Task").fill("Try a looser budget")
    page.get_by_label("Script (JSON)").fill('[{"final": "ok"}]')
    page.get_by_text("Tighter limits").click()
    page.get_by_label("Steps", exact=True).fill("99")
    page.get_by_role("button", name="Launch", exact=True).click()
    expect(page.locator("#max_steps-error")).to_have_text("max_steps may only tighten the profile's 20, not 99")
    expect(page.get_by_label("Task")).to_have_value("Try a looser budget")
    assert not Run.objects.exists()
    screenshot(page, "launch_form")
    lena = Run.objects.model._meta.get_field("created_by").related_model.objects.get(username="lena")
    for task, script in [
        ("Summarise the weekly report", SCRIPT[2:]),
        ("Reconcile the invoice batch", SCRIPT[:1]),
        ("Record the ACME invoice", SCRIPT),
    ]:
        driver.drive(run_launch(agent="scripted", task=task, user=lena, script=script).pk)
    page.goto("/runs/")
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.locator("table.runs tbody tr")).to_have_count(3)
    screenshot(page, "runs_list")
    page.goto("/")
    screenshot(page, "overview_runs")
    # The refused form answers 400 (the browser logs that); nothing else may complain.
    others = [e for e in watch.console_errors if "status of 400" not in e]
    assert len(watch.console_errors) - len(others) == 1 and not others, watch.console_errors


def test_a_long_timeline_shows_50_transitions_and_loads_the_rest(defaults, new_page, login) -> None:
    AgentProfile.objects.filter(name="scripted").update(limits={"max_steps": 1000})
    lena = person("lena", "launcher")
    script = [{"call": {"tool": "echo", "args": {"text": f"n{i}"}}} for i in range(30)] + [{"final": "done"}]
    run = driver.drive(run_launch(agent="scripted", task="a long one", script=script, user=lena).pk)
    assert run.state == "done" and run.version > 50
    page, watch = new_page()
    login(page, "lena", PASSWORD)
    page.goto(f"/runs/{run.pk}/")
    steps = page.locator("#timeline li.step")
    expect(steps).to_have_count(50)
    page.get_by_role("link", name=re.compile("Load more transitions")).click()
    expect(steps).to_have_count(run.version)
    expect(page.locator("#load-more")).to_have_count(0)
    assert page.url.endswith(f"/runs/{run.pk}/")  # appended in place, not a new page
    assert not watch.console_errors, watch.console_errors
