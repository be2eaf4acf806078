"""The seeded demo in a browser: a seeded user logs in with the printed password, sees
the demo runs on the overview and reads the poisoned demo page, with no CSP violation."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_seeded_reviewer_logs_in_and_reads_the_demo_site(defaults, settings, tmp_path, new_page, login, screenshot) -> None:
    settings.AIRLOCK_DEMO_USERS_FILE = tmp_path / "demo-users.txt"
    call_command("seed_demo", stdout=io.StringIO())
    password = dict(
        line.split() for line in settings.AIRLOCK_DEMO_USERS_FILE.read_text().splitlines() if not line.startswith("#")
    )["reviewer"]
    page, watch = new_page()
    login(page, "reviewer", password)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text(re.compile("awaiting", re.I)).first).to_be_visible()
    page.goto("/demo-site/shipping/")
    expect(page.get_by_role("heading", name="Shipping")).to_be_visible()
    expect(page.get_by_text("ignore previous instructions")).to_be_visible()
    screenshot(page, "demo-site-shipping")
    assert not watch.console_errors
