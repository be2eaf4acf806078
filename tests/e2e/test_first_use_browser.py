"""What a new user met on first use (issue 25): the launch form's policy box for a real
agent, and the review queue's keys after typing a note."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from agents.models import Approval, Run
from tests.helpers import PASSWORD, person

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_tighter_policy_box_shows_for_the_demo_agent(defaults, new_page, login) -> None:
    person("lena", "launcher")
    page, watch = new_page()
    login(page, "lena", PASSWORD)
    page.goto("/runs/new/")
    page.get_by_role("radio", name=re.compile(r"^demo ")).check()
    page.get_by_text("Tighter policy (optional)").click()
    box = page.get_by_label("Policy (JSON, optional)")
    expect(box).to_be_visible()
    rules = {"rules": [{"tool": "kb_search", "then": "deny", "reason": "no knowledge base today"}]}
    box.fill(json.dumps(rules))
    page.get_by_label("Task").fill("What are your shipping times?")
    page.get_by_role("button", name="Launch", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    assert run.profile.name == "demo"
    first = run.policy()["rules"][0]
    assert (first["origin"], first["tool"], first["then"]) == ("launch", "kb_search", "deny")
    assert not watch.console_errors, watch.console_errors


def test_escape_leaves_the_note_box_and_the_keys_work_again(new_page, login, pending) -> None:
    person("rita", "reviewer")
    approval = pending()
    page, watch = new_page()
    login(page, "rita", PASSWORD)
    page.goto("/reviews/")
    card = page.locator(f'[data-approval-id="{approval.pk}"]')
    expect(card).to_be_visible()
    page.get_by_label("Single-key shortcuts").check()
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("j")
    page.keyboard.press("n")
    note = card.get_by_label("Note to the agent")
    expect(note).to_be_focused()
    page.keyboard.type("not to everyone")
    page.keyboard.press("Escape")
    expect(card).to_be_focused()
    page.keyboard.press("r")
    expect(card.locator(".decision")).to_contain_text("Rejected by rita")
    decided = Approval.objects.get(pk=approval.pk)
    assert (decided.status, decided.note) == ("rejected", "not to everyone")
    assert not watch.console_errors, watch.console_errors


def test_a_profile_broken_in_the_database_is_unavailable_and_the_others_launch(defaults, new_page, login) -> None:
    """Issue 47: one bad value in a profile took /runs/new/ down for every launcher."""
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="demo").update(limits={"max_stepz": 5})
    person("lena", "launcher")
    page, watch = new_page()
    login(page, "lena", PASSWORD)
    response = page.goto("/runs/new/")
    assert response is not None and response.status == 200
    broken = page.get_by_role("radio", name=re.compile(r"^demo "))
    expect(broken).to_be_disabled()
    reason = re.compile(r"Cannot be launched: .*its limits: unknown limit\(s\): max_stepz")
    expect(page.get_by_text(reason)).to_be_visible()
    page.get_by_role("radio", name=re.compile(r"^scripted ")).check()
    page.get_by_label("Task").fill("say hi")
    page.locator("textarea[name=script]").fill(json.dumps([{"final": "hi"}]))
    page.get_by_role("button", name="Launch", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    assert Run.objects.get().profile.name == "scripted"
    assert not watch.console_errors, watch.console_errors
