"""The reviewer sees a history rule's figures in numbers on every surface: the queue's
card, the approval page, the Slack message and the email digest (and the approval JSON,
tests/api/test_history_rules.py)."""

from __future__ import annotations

import datetime as dt
import html

import pytest
from django.utils import timezone

from agents.models import Approval, OutboxEvent
from agents.notifications import delivery as notify
from tests.helpers import call, client_for, final

pytestmark = pytest.mark.django_db(transaction=True)  # the waiting fixture's tools write from the tool thread

FIGURES = "the 3rd ledger_write call with entry.order 1042 in this run (over 2)"
RULE = {"tool": "ledger_write", "then": "ask", "reason": "a third entry of one order",
        "history": {"scope": "run", "calls_over": 2, "same": ["entry.order"]}}


@pytest.fixture
def held(launch, drive) -> Approval:
    script = [call("ledger_write", entry={"order": "1042", "n": n}) for n in range(3)]
    run = drive(launch([*script, final()], policy={"rules": [RULE]}))
    assert run.state == "awaiting_approval"
    return Approval.objects.get(run=run, status="pending")


def test_the_card_and_the_approval_page_say_the_figures(held, rita) -> None:
    client = client_for(rita)
    for url in ("/reviews/", f"/reviews/{held.pk}/"):
        page = html.unescape(client.get(url).content.decode())
        assert f"a third entry of one order: {FIGURES}" in page, url


def test_the_slack_message_says_the_figures(held) -> None:
    data = notify.render(OutboxEvent.objects.get(type="approval.pending"))  # what a webhook is sent
    assert data["history"]["text"] == FIGURES
    detail = notify.slack_message("approval.pending", data)["blocks"][0]["text"]["text"]
    assert FIGURES in detail


def test_the_email_digest_says_the_figures(held, loopback_allowed, rita, mailoutbox) -> None:
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    assert FIGURES in mailoutbox[0].body
