"""What leaves Airlock stays in its project: a project's webhook receives its runs'
events only (a real loopback receiver verifying every signature), a webhook of every
project receives all, and a reviewer's digest lists only calls they may decide."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Membership
from agents.notifications import delivery as notify
from tests.webhook_receiver import Receiver, add_webhook

pytestmark = pytest.mark.django_db


@pytest.fixture
def loopback(settings: Any) -> None:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.AIRLOCK_WEBHOOK_TIMEOUT = 5.0
    settings.AIRLOCK_BASE_URL = "https://airlock.example.org"


@pytest.fixture
def receivers() -> Any:
    started = {name: Receiver().start() for name in ("support", "finance", "everyone")}
    yield started
    for r in started.values():
        r.stop()


def test_each_projects_webhook_receives_only_its_projects_events(loopback, receivers, teams, pending) -> None:
    events = "approval.pending,run.done"
    receivers["support"].secret = add_webhook(receivers["support"].url, events, "--project", "support")
    receivers["finance"].secret = add_webhook(receivers["finance"].url, events, "--project", "finance")
    receivers["everyone"].secret = add_webhook(receivers["everyone"].url, events)
    support = pending(user=teams["support"]["launcher"], agent="support-bot")
    finance = pending(user=teams["finance"]["launcher"], agent="finance-bot")
    notify.dispatch()

    def runs_told(r: Receiver) -> list[int]:
        assert all(not got.refused for got in r.requests)  # every signature verified
        return sorted(got.payload["data"]["run"] for got in r.requests)

    assert runs_told(receivers["support"]) == [support.run_id]
    assert runs_told(receivers["finance"]) == [finance.run_id]
    assert runs_told(receivers["everyone"]) == sorted([support.run_id, finance.run_id])


def reviewer_email(user: Any) -> Any:
    user.email = f"{user.username}@example.org"
    user.save()
    return user


def test_a_digest_lists_only_the_calls_of_the_projects_where_the_recipient_reviews(
    loopback, teams, pending, mailoutbox
) -> None:
    sue = reviewer_email(teams["support"]["reviewer"])
    fay = reviewer_email(teams["finance"]["reviewer"])
    reviewer_email(teams["support"]["operator"])  # reads support's calls, decides none: no digest
    support = pending(user=teams["support"]["launcher"], agent="support-bot")
    finance = pending(user=teams["finance"]["launcher"], agent="finance-bot")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(hours=1)) == 2
    by_person = {m.to[0]: m.body for m in mailoutbox}
    assert set(by_person) == {sue.email, fay.email}
    assert f"/reviews/{support.pk}/" in by_person[sue.email] and f"/reviews/{finance.pk}/" not in by_person[sue.email]
    assert f"/reviews/{finance.pk}/" in by_person[fay.email] and f"/reviews/{support.pk}/" not in by_person[fay.email]


def test_a_reviewer_of_both_projects_gets_both_calls(loopback, teams, pending) -> None:
    fay = teams["finance"]["reviewer"]
    Membership.objects.create(project=teams["support"].project, user=fay, role="reviewer")
    support = pending(user=teams["support"]["launcher"], agent="support-bot")
    finance = pending(user=teams["finance"]["launcher"], agent="finance-bot")
    assert {a.pk for a in notify.digest_for(fay)} == {support.pk, finance.pk}
    assert {a.pk for a in notify.digest_for(teams["support"]["reviewer"])} == {support.pk}
