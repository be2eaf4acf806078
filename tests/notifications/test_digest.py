"""Reviewers hear about pending calls by email, batched: fifty calls in a minute are one
digest each, not fifty mails; opted-out reviewers and decided calls are left out.

What a digest holds (issue 25, item 8): every pending call this reviewer may decide,
not yet mailed to them; so a reviewer who adds an email address while calls wait is told
about all of them, and nobody is told about a call twice."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents.actions.approvals import approval_decide
from agents.models import DigestEntry, NotificationPreference, OutboxEvent
from agents.notifications import delivery as notify
from tests.helpers import call, final, person

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
        assert f"https://airlock.example.org/reviews/{a.pk}/" in message.body
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
    assert f"/reviews/{still.pk}/" in body and f"/reviews/{decided.pk}/" not in body
    assert mailoutbox[0].subject == "Airlock: 1 tool call waiting for review"
    assert body.startswith("1 tool call waits for a reviewer:\n")


def test_nothing_is_sent_when_every_call_was_decided(loopback_allowed, waiting, mailoutbox) -> None:
    rita = reviewer("rita")
    approval = waiting()
    approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 0
    assert mailoutbox == []
    assert not DigestEntry.objects.exists()


def test_the_digest_goes_through_djangos_file_backend(loopback_allowed, waiting, settings, tmp_path) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path
    reviewer("rita")
    approval = waiting()
    notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2))
    written = [p.read_text() for p in tmp_path.iterdir()]
    assert len(written) == 1 and f"/reviews/{approval.pk}/" in written[0]
    assert "To: rita@example.org" in written[0]


def test_a_reviewer_who_adds_an_email_while_three_calls_wait_gets_all_three(loopback_allowed, waiting, mailoutbox) -> None:
    rita = reviewer("rita")
    rob = person("rob", "reviewer")  # no email address yet
    first, second = waiting(entry="one"), waiting(entry="two")
    later = timezone.now() + dt.timedelta(minutes=2)
    assert notify.send_digest(now=later) == 1
    assert [m.to for m in mailoutbox] == [[rita.email]]

    rob.email = "rob@example.org"
    rob.save()
    third = waiting(entry="three")
    assert notify.send_digest(now=later + dt.timedelta(minutes=2)) == 2
    robs = next(m for m in mailoutbox[1:] if m.to == [rob.email])
    ritas = next(m for m in mailoutbox[1:] if m.to == [rita.email])
    assert robs.subject == "Airlock: 3 tool calls waiting for review"
    assert all(f"/reviews/{a.pk}/" in robs.body for a in (first, second, third))
    # rita was told about the first two already: only the third is new to her.
    assert ritas.subject == "Airlock: 1 tool call waiting for review"
    assert f"/reviews/{third.pk}/" in ritas.body and f"/reviews/{first.pk}/" not in ritas.body

    assert notify.send_digest(now=later + dt.timedelta(hours=1)) == 0
    assert len(mailoutbox) == 3


def test_a_new_call_waits_its_window_for_each_reviewer(loopback_allowed, waiting, mailoutbox) -> None:
    reviewer("rita")
    old = waiting(entry="old")
    assert notify.send_digest(now=old.created_at + dt.timedelta(seconds=61)) == 1
    new = waiting(entry="new")
    assert notify.send_digest(now=new.created_at + dt.timedelta(seconds=30)) == 0  # its minute is not over
    assert notify.send_digest(now=new.created_at + dt.timedelta(seconds=61)) == 1
    assert f"/reviews/{new.pk}/" in mailoutbox[1].body and f"/reviews/{old.pk}/" not in mailoutbox[1].body


def test_calls_the_reviewer_may_not_decide_are_left_out(loopback_allowed, waiting, mailoutbox) -> None:
    rita = reviewer("rita")
    rita.groups.add(*person("lena", "launcher").groups.all())  # rita launches too
    rob = reviewer("rob")
    hers = waiting(entry="hers", user=rita, policy={"separate_duties": True})
    other = waiting(entry="other")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 2
    by = {m.to[0]: m.body for m in mailoutbox}
    assert f"/reviews/{hers.pk}/" not in by[rita.email] and f"/reviews/{other.pk}/" in by[rita.email]
    assert f"/reviews/{hers.pk}/" in by[rob.email] and f"/reviews/{other.pk}/" in by[rob.email]


def test_a_call_the_reviewer_already_voted_on_waits_for_the_others_without_them(
    loopback_allowed, launch, drive, mailoutbox
) -> None:
    rita, rob = reviewer("rita"), reviewer("rob")
    two = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two sign the ledger"}
    run = drive(launch([call("ledger_write", entry="pay"), final("paid")], policy={"rules": [two]}))
    approval = run.approvals.get()
    approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    assert [m.to for m in mailoutbox] == [[rob.email]] and f"/reviews/{approval.pk}/" in mailoutbox[0].body


def test_a_failed_send_is_tried_again_in_the_next_round(loopback_allowed, waiting, mailoutbox, monkeypatch) -> None:
    reviewer("rita")
    approval = waiting()
    real = notify.get_connection

    def broken(*args, **kwargs):
        raise OSError("SMTP down")

    monkeypatch.setattr(notify, "get_connection", broken)
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 0
    assert not DigestEntry.objects.exists()
    monkeypatch.setattr(notify, "get_connection", real)
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    assert f"/reviews/{approval.pk}/" in mailoutbox[0].body
