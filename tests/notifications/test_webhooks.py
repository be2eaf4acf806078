"""Webhook delivery to a real receiver on loopback that verifies every request with the
`standardwebhooks` library: bodies, retries under one webhook-id, dead letters and
resends, Slack's body, and the private-address guard."""

from __future__ import annotations

import json
import re
from collections import deque
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_launch
from agents.models import Delivery, DeliveryAttempt, OutboxEvent, Webhook
from agents.notifications import delivery as notify
from tests.helpers import person
from tests.webhook_receiver import Receiver, add_webhook

pytestmark = pytest.mark.django_db

ALL = "approval.pending,approval.decided,approval.expired,run.done,run.failed,run.cancelled"


def deliver_all(rounds: int = 1) -> None:
    for _ in range(rounds):
        notify.dispatch()


def api_get(user: Any, path: str) -> Any:
    client = Client()
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_every_event_arrives_signed_with_the_apis_json_and_a_link(
    loopback_allowed, receiver: Receiver, waiting, drive, rita
) -> None:
    receiver.secret = add_webhook(receiver.url, ALL)
    approval = waiting()
    deliver_all()
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="fine")
    run = drive(approval.run)
    assert run.state == "done"
    deliver_all()

    assert receiver.types() == ["approval.pending", "approval.decided", "run.done"]
    assert [r.refused for r in receiver.requests] == ["", "", ""]  # every signature verified
    assert len({r.msg_id for r in receiver.requests}) == 3
    pending, decided, done = (r.payload for r in receiver.requests)
    base = "https://airlock.example.org"
    assert pending["data"]["url"] == f"{base}/reviews/{approval.pk}/"
    assert pending["data"]["status"] == "pending" and pending["data"]["tool"] == "ledger_write"
    assert decided["data"]["status"] == "approved" and decided["data"]["decided_by"] == "rita"
    # `data` is the API's JSON of the object, plus the link.
    api_approval = api_get(rita, "/api/approvals?status=approved")["items"][0]
    assert {k: v for k, v in decided["data"].items() if k != "url"} == api_approval
    api_run = api_get(rita, f"/api/runs/{run.pk}")
    assert done["data"] == {**api_run, "url": f"{base}/runs/{run.pk}/"}
    assert done["type"] == "run.done" and done["timestamp"].startswith(str(run.finished_at.date()))
    assert Delivery.objects.filter(status="delivered").count() == 3


def test_a_webhook_gets_only_its_events(loopback_allowed, receiver: Receiver, launch, drive) -> None:
    receiver.secret = add_webhook(receiver.url, "run.failed")
    drive(launch([{"final": "fine"}]))
    drive(launch([{"call": {"tool": "nope", "args": {}}}] * 3))
    deliver_all()
    assert receiver.types() == ["run.failed"]


def test_a_receiver_failing_twice_gets_the_same_webhook_id_three_times(
    loopback_allowed, receiver: Receiver, launch, drive
) -> None:
    receiver.secret = add_webhook(receiver.url, "run.done")
    receiver.statuses = deque([500, 503])
    run = drive(launch([{"final": "ok"}]))
    deliver_all(rounds=4)  # retries come due at once here (AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS=0)

    ids = [r.msg_id for r in receiver.requests]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert ids[0] == OutboxEvent.objects.get(run=run).msg_id
    assert len({r.body for r in receiver.requests}) == 1  # the same bytes each time
    assert all(not r.refused for r in receiver.requests)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 3, 200)
    attempts = list(delivery.attempt_rows.values_list("number", "status_code", "error"))
    assert attempts == [(1, 500, "HTTP 500"), (2, 503, "HTTP 503"), (3, 200, "")]


def test_a_delivery_is_dead_after_its_attempts_and_an_operator_resends_it(
    loopback_allowed, receiver: Receiver, launch, drive, defaults
) -> None:
    loopback_allowed.AIRLOCK_WEBHOOK_MAX_ATTEMPTS = 3
    receiver.secret = add_webhook(receiver.url, "run.done")
    receiver.statuses = deque([500, 500, 500])
    drive(launch([{"final": "ok"}]))
    deliver_all(rounds=5)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("dead", 3)
    assert len(receiver.requests) == 3

    admin = person("ada", superuser=True)
    client = Client()
    client.force_login(admin)
    page = client.get(f"/admin/agents/delivery/{delivery.pk}/change/").content.decode()
    assert "HTTP 500" in page and delivery.event.msg_id in page
    assert receiver.secret not in page
    response = client.post(
        "/admin/agents/delivery/", {"action": "resend", "_selected_action": [delivery.pk]}, follow=True
    )
    assert "Queued 1 dead delivery" in response.content.decode()
    deliver_all()
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert len({r.msg_id for r in receiver.requests}) == 1 and len(receiver.requests) == 4
    assert list(delivery.attempt_rows.values_list("number", "status_code")) == [(1, 500), (2, 500), (3, 500), (4, 200)]


def test_slack_format_posts_text_and_blocks_with_the_link(loopback_allowed, receiver: Receiver, waiting) -> None:
    receiver.secret = add_webhook(receiver.url, "approval.pending", "--format", "slack")
    approval = waiting(entry="<!channel> & friends")
    deliver_all()
    body = json.loads(receiver.requests[0].body)
    assert set(body) == {"text", "blocks"}
    link = f"https://airlock.example.org/reviews/{approval.pk}/"
    assert link in body["text"] and "ledger_write" in body["text"]
    # The buttons answer through the Slack app (issue 27, tests/notifications/test_slack_interactions.py).
    assert [b["type"] for b in body["blocks"]] == ["section", "section", "actions", "context"]
    assert [e["action_id"] for e in body["blocks"][2]["elements"]] == ["approve", "reject"]
    assert body["blocks"][0]["text"]["type"] == "mrkdwn"
    assert "ledger_write writes and the run has read external content" in body["blocks"][0]["text"]["text"]
    assert body["blocks"][1]["text"]["text"] == f"<{link}|Open the call>"
    assert not receiver.requests[0].refused  # signed like any other


def test_slack_text_from_a_run_is_escaped() -> None:
    message = notify.slack_message(
        "run.failed",
        {"id": 7, "agent": "demo", "state": "failed", "task": "<@U1> hi", "error": "a > b & c", "url": "u"},
    )
    assert "&lt;@U1&gt; hi" in message["blocks"][0]["text"]["text"]
    assert "a &gt; b &amp; c" in message["blocks"][0]["text"]["text"]


def test_a_private_address_is_refused_unless_allowed(settings, receiver: Receiver, launch, drive) -> None:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = []
    settings.AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS = 0.0
    err = StringIO()
    receiver.secret = add_webhook(receiver.url, "run.done")
    call_command("add_webhook", receiver.url, "--events", "run.done", stdout=StringIO(), stderr=err)
    assert "a loopback address" in err.getvalue()
    drive(launch([{"final": "ok"}]))
    deliver_all()
    assert receiver.requests == []
    attempt = DeliveryAttempt.objects.first()
    assert attempt.status_code is None
    assert attempt.error.startswith("refused: 127.0.0.1 resolves to 127.0.0.1, a loopback address")
    assert "AIRLOCK_WEBHOOK_ALLOWED_HOSTS" in attempt.error

    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    Delivery.objects.update(next_attempt_at=attempt.started_at)
    deliver_all()
    assert len(receiver.requests) == 2  # both webhooks, now let through


@pytest.mark.parametrize(
    ("url", "events", "problem"),
    [
        ("https://hooks.example.org/a", "run.done,run.exploded", "unknown event type(s) ['run.exploded']"),
        ("ftp://hooks.example.org/a", "run.done", "url: Enter a valid URL."),
        ("https://hooks.example.org/a", ",", "events: This field cannot be blank."),
    ],
)
def test_add_webhook_refuses_bad_input(db, url: str, events: str, problem: str) -> None:
    with pytest.raises(CommandError, match=re.escape(problem)):
        call_command("add_webhook", url, "--events", events, stdout=StringIO())
    assert not Webhook.objects.exists()


def test_add_webhook_prints_the_secret_once_as_its_last_line(db) -> None:
    out = StringIO()
    call_command("add_webhook", "https://hooks.example.org/a", "--events", "run.done", "--format", "slack", stdout=out)
    hook = Webhook.objects.get()
    assert out.getvalue().splitlines()[-1] == hook.secret
    assert hook.secret.startswith("whsec_") and (hook.format, hook.events) == ("slack", ["run.done"])


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_the_demo_produces_verifiable_events_with_working_links(
    loopback_allowed, receiver: Receiver, drive, rita
) -> None:
    from agents import demo

    receiver.secret = add_webhook(receiver.url, "approval.pending,run.done")
    client = Client()
    client.force_login(rita)
    scenario = next(s for s in demo.SCENARIOS if s["name"] == "customer-question")
    run = drive(run_launch(agent=scenario["agent"], task=scenario["task"]))
    deliver_all()
    approval = run.approvals.get()
    card = receiver.requests[0].payload["data"]["url"].removeprefix("https://airlock.example.org")
    assert card == f"/reviews/{approval.pk}/"
    assert f'data-approval-id="{approval.pk}"' in client.get(card).content.decode()

    approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    assert drive(run).state == "done"
    deliver_all()
    assert receiver.types() == ["approval.pending", "run.done"]
    assert all(not r.refused for r in receiver.requests)
    timeline = receiver.requests[1].payload["data"]["url"].removeprefix("https://airlock.example.org")
    page = client.get(timeline)
    assert page.status_code == 200 and "send_email" in page.content.decode()
