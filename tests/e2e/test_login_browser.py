from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_person_logs_in_and_sees_the_overview(new_page, login, screenshot) -> None:
    User.objects.create_user("ada", password="correct horse battery")
    page, watch = new_page()
    login(page, "ada", "correct horse battery")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text("ada").first).to_be_visible()
    screenshot(page, "overview")
    assert not watch.console_errors
