"""The demo web site pages at /demo-site/: logged-in users only, content as inert text."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.demo import PLANTED_INSTRUCTION

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser() -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("lena"))
    return client


def test_anonymous_visitor_is_sent_to_login(client) -> None:
    response = client.get("/demo-site/shipping/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_shipping_page_shows_the_planted_instruction_marked(browser) -> None:
    response = browser.get("/demo-site/shipping/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "6-9 business days" in html
    assert 'class="planted"' in html and PLANTED_INSTRUCTION in html
    assert "https://demo.airlock.internal/shipping" in html


def test_index_and_unknown_pages(browser) -> None:
    assert browser.get("/demo-site/").status_code == 200
    assert browser.get("/demo-site/nope/").status_code == 404
