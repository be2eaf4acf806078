"""A reviewer turns the email digest off (and on) for themselves."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import NotificationPreference
from agents.notifications import delivery as notify
from tests.helpers import person

pytestmark = pytest.mark.django_db

URL = "/account/notifications/"


def browser(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def post_form(client: Client, data: dict[str, str]) -> object:
    client.get(URL)
    return client.post(URL, {**data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value}, follow=True)


def test_a_reviewer_turns_the_digest_off_and_gets_none(loopback_allowed, rita, waiting, mailoutbox) -> None:
    client = browser(rita)
    page = client.get(URL).content.decode()
    assert 'name="email_digest" checked' in page
    response = post_form(client, {})  # the box unticked
    assert "Digest emails are off." in response.content.decode()
    assert 'name="email_digest" checked' not in response.content.decode()
    assert not NotificationPreference.digest_on(rita)
    waiting()
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 0
    assert mailoutbox == []


def test_turning_it_back_on(loopback_allowed, rita, waiting, mailoutbox) -> None:
    NotificationPreference.set_digest(rita, False)
    response = post_form(browser(rita), {"email_digest": "on"})
    assert "Digest emails are on." in response.content.decode()
    approval = waiting()
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    assert f"/reviews/{approval.pk}/" in mailoutbox[0].body
    assert "Turn these emails off: https://airlock.example.org/account/notifications/" in mailoutbox[0].body


def test_the_page_needs_a_login_and_csrf(rita) -> None:
    assert Client().get(URL).status_code == 302
    assert browser(rita).post(URL, {"email_digest": "on"}).status_code == 403
    assert NotificationPreference.digest_on(rita)


def test_someone_who_is_not_a_reviewer_is_told_no_digest_is_sent(defaults) -> None:
    page = browser(person("otto", "operator")).get(URL).content.decode()
    assert "you are not one, so none are sent to you" in page
