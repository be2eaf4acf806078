from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db


def test_every_page_needs_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/login/?next=/")


def test_login_then_overview_shows_the_user(client: Client) -> None:
    User.objects.create_user("ada", password="correct horse battery")
    response = client.post("/login/", {"username": "ada", "password": "correct horse battery"}, follow=True)
    assert response.status_code == 200
    assert b"Overview" in response.content and b"ada" in response.content


def test_wrong_password_is_refused(client: Client) -> None:
    User.objects.create_user("ada", password="correct horse battery")
    response = client.post("/login/", {"username": "ada", "password": "nope"})
    assert response.status_code == 200 and b"Please enter a correct username" in response.content


def test_login_post_without_csrf_token_is_refused() -> None:
    User.objects.create_user("ada", password="correct horse battery")
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"username": "ada", "password": "correct horse battery"})
    assert response.status_code == 403


def test_pages_carry_a_strict_content_security_policy(client: Client) -> None:
    response = client.get("/login/")
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp


def test_after_the_failure_limit_even_the_right_password_is_refused_until_unlocked(client: Client, settings) -> None:
    from django.core.management import call_command

    User.objects.create_user("ada", password="correct horse battery")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/login/", {"username": "ada", "password": "wrong"})
    response = client.post("/login/", {"username": "ada", "password": "correct horse battery"})
    assert response.status_code == 429 and b"is paused until" in response.content
    assert "_auth_user_id" not in client.session
    call_command("axes_reset_username", "ada", verbosity=0)
    response = client.post("/login/", {"username": "ada", "password": "correct horse battery"})
    assert response.status_code == 302 and client.session["_auth_user_id"]
