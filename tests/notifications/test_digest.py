"""Reviewers hear about pending calls by email, batched: fifty calls in a minute are one
digest each, not fifty mails; opted-out reviewers and decided calls are left out."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents import notify
from agents.actions import approval_decide
from agents.models import NotificationPreference, OutboxEvent
from tests.helpers import person

pytestmark = pytest.mark.django_db


def reviewer(name: str, *, digest: bool = True) -> User:
    user = person(name, "reviewer")
    user.email = f"{name}@example.org"
    user.save()
    if not digest:
        NotificationPreference.objects.create(user=user, email_digest=False)
    return user


def test_fifty_pending_calls_in_a_minute_make_one_digest_per_reviewer(loopback_allowed, waiting, mailoutbox) -> None:
    rita, rob = reviewer("rita"), reviewer("rob")
    reviewer("quinn", digest=False)
    otto = person("otto", "operator")
    otto.email = "otto@example.org"
    otto.save()
    approvals = [waiting(entry=f"entry {i}") for i in range(50)]
    first = OutboxEvent.objects.filter(type="approval.pending").order_by("created_at").first()
    assert OutboxEvent.objects.filter(type="approval.pending").count() == 50

    assert notify.send_digest(now=first.created_at + dt.timedelta(seconds=30)) == 0  # the minute is not over
    assert mailoutbox == []
    assert notify.send_digest(now=first.created_at + dt.timedelta(seconds=61)) == 2
    assert sorted(m.to[0] for m in mailoutbox) == [rita.email, rob.email]  # not quinn, not the operator
    message = mailoutbox[0]
    assert message.subject == "Airlock: 50 tool calls waiting for review"
    assert message.body.startswith("50 tool calls wait for a reviewer:\n")
    for a in approvals:
        assert f"https://airlock.example.org/reviews/#approval-{a.pk}" in message.body
    assert (
        "ledger_write (run" in message.body
        and "ledger_write writes and the run has read external content" in message.body
    )

    assert notify.send_digest(now=timezone.now() + dt.timedelta(hours=1)) == 0  # each call is told once
    assert len(mailoutbox) == 2


def test_calls_decided_before_the_digest_are_left_out(loopback_allowed, waiting, mailoutbox) -> None:
    rita = reviewer("rita")
    decided, still = waiting(entry="one"), waiting(entry="two")
    approval_decide(approval_id=decided.pk, user=rita, decision="reject")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    body = mailoutbox[0].body
    assert f"#approval-{still.pk}" in body and f"#approval-{decided.pk}" not in body
    assert mailoutbox[0].subject == "Airlock: 1 tool call waiting for review"
    assert body.startswith("1 tool call waits for a reviewer:\n")


def test_nothing_is_sent_when_every_call_was_decided(loopback_allowed, waiting, mailoutbox) -> None:
    rita = reviewer("rita")
    approval = waiting()
    approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 0
    assert mailoutbox == []
    assert OutboxEvent.objects.get(type="approval.pending").emailed_at is not None


def test_the_digest_goes_through_djangos_file_backend(loopback_allowed, waiting, settings, tmp_path) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path
    reviewer("rita")
    approval = waiting()
    notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2))
    written = [p.read_text() for p in tmp_path.iterdir()]
    assert len(written) == 1 and f"#approval-{approval.pk}" in written[0]
    assert "To: rita@example.org" in written[0]
