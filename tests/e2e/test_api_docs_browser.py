from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_logged_in_user_browses_the_api_docs_under_the_strict_csp(new_page, login, screenshot) -> None:
    User.objects.create_user("ada", password="correct horse battery")
    page, watch = new_page()
    login(page, "ada", "correct horse battery")
    page.goto("/api/docs")
    page.get_by_text("/api/runs/{run_id}/transitions").first.wait_for()
    expect(page.get_by_text("Airlock API").first).to_be_visible()
    screenshot(page, "api-docs")
