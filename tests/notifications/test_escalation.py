"""Escalation (issue 28): the sweeper escalates a call still pending its profile's
`escalate_after_seconds` after it was asked, once, however many sweepers race; the
`approval.escalated` event reaches webhooks and the backup group's digest, the card and
the timeline say so, and the expiry reminder still goes out."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents.actions.approvals import approval_decide, approval_escalate
from agents.models import AgentProfile, Approval, MetricTally, OutboxEvent
from agents.notifications import delivery as notify
from agents.ops import metrics
from agents.runs.sweeper import sweep
from tests.helpers import at_once, client_for, person, requires_postgres, reviewed_profile
from tests.webhook_receiver import Receiver, add_webhook

pytestmark = pytest.mark.django_db

WAIT = 600  # the profile's escalate_after_seconds


@pytest.fixture
def payments(defaults: None) -> AgentProfile:
    return reviewed_profile(escalate_after_seconds=WAIT)


def member(name: str, group: str) -> User:
    user = person(name, group)
    user.email = f"{name}@example.org"
    user.save()
    return user


@pytest.fixture
def paula(payments: AgentProfile) -> User:
    return member("paula", "payments-reviewers")


@pytest.fixture
def bea(payments: AgentProfile) -> User:
    return member("bea", "payments-leads")


def asked(waiting: Any, *, ago: float, **kwargs: Any) -> Approval:
    """A payments call asked `ago` seconds ago."""
    approval = waiting(agent="payments", **kwargs)
    Approval.objects.filter(pk=approval.pk).update(created_at=timezone.now() - dt.timedelta(seconds=ago))
    return Approval.objects.get(pk=approval.pk)


def events(approval: Approval, kind: str = "approval.escalated") -> int:
    return OutboxEvent.objects.filter(approval=approval, type=kind).count()


def test_a_call_is_escalated_once_after_its_wait(payments: AgentProfile, waiting: Any) -> None:
    early = asked(waiting, ago=WAIT - 30, entry="early")
    due = asked(waiting, ago=WAIT + 5, entry="due")
    assert sweep()["escalated"] == 1
    assert sweep()["escalated"] == 0  # and never again
    due.refresh_from_db()
    early.refresh_from_db()
    assert due.escalated_at is not None and due.escalated_to == "payments-leads"
    assert due.status == "pending"  # escalated, still waiting for an answer
    assert early.escalated_at is None
    assert (events(due), events(early)) == (1, 0)
    assert due.to_dict()["escalated_at"] == due.escalated_at


def test_a_profile_without_escalation_or_a_decided_call_is_left_alone(
    payments: AgentProfile, waiting: Any, paula: User
) -> None:
    plain = waiting()  # the scripted agent escalates nothing
    Approval.objects.filter(pk=plain.pk).update(created_at=timezone.now() - dt.timedelta(days=1))
    decided = asked(waiting, ago=WAIT + 5)
    approval_decide(approval_id=decided.pk, user=paula, decision="reject")
    assert sweep()["escalated"] == 0
    assert not OutboxEvent.objects.filter(type="approval.escalated").exists()
    assert not approval_escalate(approval_id=decided.pk)  # decided: nothing to escalate


@requires_postgres()
@pytest.mark.django_db(transaction=True)  # each racer commits on its own connection
def test_concurrent_sweepers_escalate_each_call_once(payments: AgentProfile, waiting: Any) -> None:
    calls = [asked(waiting, ago=WAIT + 5, entry=f"refund {i}") for i in range(3)]
    won = at_once(lambda _: sweep()["escalated"], range(6))
    assert sum(won) == 3  # each call escalated by exactly one of the six
    for a in calls:
        assert events(a) == 1
    # The conditional update alone, raced per call: one winner each.
    again = asked(waiting, ago=WAIT + 5, entry="one more")
    results = at_once(lambda _: approval_escalate(approval_id=again.pk), range(8))
    assert results.count(True) == 1 and events(again) == 1
    # The metric counts escalations, not attempts (airlock_approval_escalations_total).
    tally = MetricTally.objects.get(name=metrics.ESCALATIONS, labels=metrics._labels(payments.name))
    assert tally.count == 4


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_an_escalation_racing_a_decision_leaves_one_consistent_answer(
    payments: AgentProfile, waiting: Any, paula: User
) -> None:
    for i in range(5):
        a = asked(waiting, ago=WAIT + 5, entry=f"race {i}")
        jobs = ["escalate", "decide"]

        def go(job: str, pk: int = a.pk) -> Any:
            if job == "escalate":
                return approval_escalate(approval_id=pk)
            return approval_decide(approval_id=pk, user=paula, decision="approve").outcome

        escalated, outcome = at_once(go, jobs)
        a.refresh_from_db()
        assert outcome == "decided" and a.status == "approved"
        # Escalated before the answer (then its event is there) or not at all.
        assert events(a) == (1 if escalated else 0)
        assert (a.escalated_at is not None) == escalated


def test_the_event_reaches_a_real_webhook_receiver(
    loopback_allowed: Any, receiver: Receiver, payments: AgentProfile, waiting: Any
) -> None:
    receiver.secret = add_webhook(receiver.url, "approval.escalated")
    approval = asked(waiting, ago=WAIT + 5)
    notify.dispatch()
    assert receiver.requests == []  # approval.pending is not subscribed
    sweep()
    notify.dispatch()
    assert receiver.types() == ["approval.escalated"]
    [got] = receiver.requests
    assert not got.refused  # signed
    data = got.payload["data"]
    assert (data["id"], data["status"], data["escalated_to"]) == (approval.pk, "pending", "payments-leads")
    assert data["escalated_at"] is not None
    assert data["url"] == f"https://airlock.example.org/reviews/{approval.pk}/"


def test_a_slack_webhook_says_where_it_went_and_offers_the_buttons(
    loopback_allowed: Any, receiver: Receiver, payments: AgentProfile, waiting: Any
) -> None:
    receiver.secret = add_webhook(receiver.url, "approval.escalated", "--format", "slack")
    approval = asked(waiting, ago=WAIT + 5)
    sweep()
    notify.dispatch()
    body = json.loads(receiver.requests[0].body)
    assert "escalated to payments-leads" in body["text"]
    actions = [b for b in body["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions[0]["elements"]] == ["approve", "reject"]
    value = json.loads(actions[0]["elements"][0]["value"])
    assert value == {"approval": approval.pk, "args_hash": approval.args_hash, "sent": value["sent"]}


def test_the_backup_groups_digest_holds_the_call_once_it_is_escalated(
    loopback_allowed: Any, payments: AgentProfile, waiting: Any, paula: User, bea: User, mailoutbox: Any
) -> None:
    approval = asked(waiting, ago=WAIT - 60)
    link = f"/reviews/{approval.pk}/"
    # Asked ten minutes ago: the digest is due, for the reviewers only.
    assert notify.send_digest() == 1
    assert [m.to for m in mailoutbox] == [["paula@example.org"]] and link in mailoutbox[0].body
    Approval.objects.filter(pk=approval.pk).update(created_at=approval.created_at - dt.timedelta(seconds=90))
    assert sweep()["escalated"] == 1
    assert notify.send_digest() == 1
    assert mailoutbox[1].to == ["bea@example.org"] and link in mailoutbox[1].body
    assert re.search(r"/reviews/links/[A-Za-z0-9_-]+/", mailoutbox[1].body)  # her own link to decide
    assert notify.send_digest() == 0  # each is told once


def test_the_expiry_reminder_still_goes_out(payments: AgentProfile, waiting: Any) -> None:
    approval = waiting(agent="payments", policy={"approval_timeout_seconds": 1000})
    # 1000 s to answer, escalated after 600: 850 s in, it is both escalated and expiring.
    Approval.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - dt.timedelta(seconds=850), expires_at=timezone.now() + dt.timedelta(seconds=150)
    )
    result = sweep()
    assert (result["escalated"], result["expiring"]) == (1, 1)
    assert (events(approval), events(approval, "approval.expiring")) == (1, 1)


def test_the_card_and_the_timeline_say_when_and_to_whom(payments: AgentProfile, waiting: Any, paula: User) -> None:
    approval = asked(waiting, ago=WAIT + 5)
    before = client_for(paula).get(f"/reviews/{approval.pk}/").content.decode()
    assert "Escalated to" not in before
    sweep()
    approval.refresh_from_db()
    assert approval.escalated_at is not None
    hhmm = timezone.localtime(approval.escalated_at).strftime("%H:%M")
    card = client_for(paula).get(f"/reviews/{approval.pk}/").content.decode()
    assert re.search(
        rf'<p class="escalated">Escalated to <strong class="group">payments-leads</strong> at <time [^>]*>{hhmm}</time>',
        card,
    )
    queue = client_for(paula).get("/reviews/").content.decode()
    assert "payments-leads</strong> at <time" in queue
    timeline = client_for(paula).get(f"/runs/{approval.run_id}/").content.decode()
    assert re.search(
        rf'Escalated to <strong class="group">payments-leads</strong> at <time [^>]*>{hhmm}:\d\d</time>', timeline
    )


def test_a_group_name_with_markup_stays_inert(defaults: None, waiting: Any) -> None:
    from django.contrib.auth.models import Group

    Group.objects.create(name="<b>leads</b>")
    reviewed_profile(backup_group="<b>leads</b>")
    approval = asked(waiting, ago=WAIT + 5)
    sweep()
    page = client_for(person("root", superuser=True)).get(f"/reviews/{approval.pk}/").content.decode()
    assert "&lt;b&gt;leads&lt;/b&gt;" in page and "<b>leads</b>" not in page
