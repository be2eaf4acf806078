"""Single sign-on end to end in Chromium: Airlock's button, the loopback OpenID
Provider's own sign-in form (tests/accounts/provider.py), and back to the dashboard with the
roles the groups claim gives."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents.models import Membership, Project

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_person_signs_in_with_the_identity_provider_and_gets_roles(browser, live_server, sso, defaults, screenshot):
    Project.objects.create(slug="support", name="Support")
    sso.register(f"{live_server.url}/accounts/oidc/sso/login/callback/")
    sso.add_person("ada", groups=["support:reviewer", "*:launcher", "*:reviewer"], name="Ada Lovelace")
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    csp_errors: list[str] = []
    page.on("console", lambda m: csp_errors.append(m.text) if "Content Security Policy" in m.text else None)
    try:
        page.goto("/runs/")  # a page that needs a login: back here afterwards
        page.wait_for_url("**/login/?next=/runs/")
        page.get_by_role("button", name="Sign in with Example ID").click()
        page.wait_for_url(f"{sso.issuer}/authorize?*")
        expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
        page.get_by_label("Username").fill("ada")
        page.get_by_label("Password").fill("pw-ada")
        page.get_by_role("button", name="Sign in").click()

        page.wait_for_url(f"{live_server.url}/runs/")
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        nav = page.get_by_role("navigation", name="Main")
        expect(nav.get_by_role("link", name="Launch")).to_be_visible()  # *:launcher
        expect(page.get_by_text("ada").first).to_be_visible()
        screenshot(page, "sso-signed-in")
        ada = User.objects.get(username="ada")
        assert set(ada.groups.values_list("name", flat=True)) == {"launcher", "reviewer"}
        assert list(Membership.objects.filter(user=ada).values_list("project__slug", "role")) == [("support", "reviewer")]
        assert not csp_errors, csp_errors
    finally:
        context.close()


def test_the_break_glass_form_is_behind_a_disclosure_when_password_login_is_off(
    browser, live_server, sso, settings, root
):
    settings.AIRLOCK_PASSWORD_LOGIN = False
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    try:
        page.goto("/login/")
        expect(page.get_by_role("button", name="Sign in with Example ID")).to_be_visible()
        expect(page.get_by_label("Password")).to_be_hidden()
        page.get_by_text("Administrator sign-in").click()
        page.get_by_label("Username").fill("root")
        page.get_by_label("Password").fill("correct horse battery")
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/")
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    finally:
        context.close()
