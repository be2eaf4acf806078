"""Deciding from Slack (issue 27): a click on a signed Slack message decides as the
linked reviewer with every guarantee of the dashboard, and nothing else decides.

Slack's side is real: requests signed with slack_sdk's SignatureVerifier as Slack signs
them, and the message's `response_url` is a real HTTP receiver on loopback."""

from __future__ import annotations

import json
import time
import urllib.parse
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client
from slack_sdk.signature import SignatureVerifier

from agents.actions.approvals import approval_decide
from agents.models import (
    Approval,
    LedgerEntry,
    NotificationPreference,
    OutboxEvent,
    Run,
    SlackAction,
    Transition,
    Webhook,
)
from agents.notifications import delivery, slack
from tests.helpers import CsrfClient, at_once, call, final, person
from tests.notifications.conftest import PLANTED

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
URL = "/integrations/slack/interactions"


@pytest.fixture(autouse=True)
def slack_app(loopback_allowed: Any) -> Any:
    loopback_allowed.AIRLOCK_SLACK_SIGNING_SECRET = SECRET
    loopback_allowed.AIRLOCK_SLACK_ANSWER_SECONDS = 30.0
    yield loopback_allowed
    slack.wait_idle()


@pytest.fixture
def receiver() -> Any:
    """Slack's side of `response_url`: a real HTTP server on loopback. (Slack signs
    nothing it receives; the receiver's Standard Webhooks check just records a refusal.)"""
    from tests.webhook_receiver import Receiver

    r = Receiver(secret=delivery.new_secret()).start()
    yield r
    r.stop()


def linked(name: str, member: str, *groups: str) -> User:
    user = person(name, *(groups or ("reviewer",)))
    out = StringIO()
    call_command("link_slack", name, member, stdout=out)
    assert f"linked Slack member {member} to {name}" in out.getvalue()
    return user


def payload(
    approval: Approval,
    member: str,
    action: str = "approve",
    *,
    args_hash: str | None = None,
    action_ts: str = "1700000000.000100",
    response_url: str = "",
) -> dict[str, Any]:
    value = {"approval": approval.pk, "args_hash": approval.args_hash if args_hash is None else args_hash}
    return {
        "type": "block_actions",
        "user": {"id": member, "username": member.lower()},
        "response_url": response_url,
        "actions": [
            {
                "action_id": action,
                "block_id": f"airlock_approval_{approval.pk}",
                "value": json.dumps(value),
                "type": "button",
                "action_ts": action_ts,
            }
        ],
    }


def post(data: dict[str, Any], *, secret: str = SECRET, timestamp: int | None = None, retry: str | None = None) -> Any:
    body = urllib.parse.urlencode({"payload": json.dumps(data)})
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    headers = {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body),
    }
    if retry is not None:
        headers["X-Slack-Retry-Num"] = retry
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    response = Client().post(URL, body, content_type="application/x-www-form-urlencoded", headers=headers)
    return response


def answers(receiver: Any) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in receiver.requests]


def test_a_signed_click_by_a_linked_reviewer_approves_once_and_rewrites_the_message(waiting, receiver, drive) -> None:
    linked("rita", "U0RITA")
    approval = waiting()
    response = post(payload(approval, "U0RITA", response_url=receiver.url))
    assert response.status_code == 200
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by.username, approval.via) == ("approved", "rita", "slack")
    assert [v.via for v in approval.votes.all()] == ["slack"]
    [message] = answers(receiver)
    assert message["replace_original"] is True
    assert "approved by rita via slack" in message["text"]
    assert f"/reviews/{approval.pk}/" in message["text"]
    assert drive(approval.run).state == "done"
    assert LedgerEntry.objects.filter(run=approval.run).count() == 1
    assert SlackAction.objects.get().outcome == "decided"
    # The timeline and the approval JSON say where the decision came from.
    page = CsrfClient()
    page.force_login(person("root", superuser=True))
    assert '<span class="via">(via slack)</span>' in page.get(f"/runs/{approval.run_id}/").content.decode()
    assert "via slack" in page.get(f"/reviews/{approval.pk}/").content.decode()
    assert approval.to_dict()["via"] == "slack"


def test_a_wrong_signature_is_refused_and_decides_nothing(waiting) -> None:
    linked("rita", "U0RITA")
    approval = waiting()
    response = post(payload(approval, "U0RITA"), secret="not-the-app-secret")
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_signature"
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not SlackAction.objects.exists()


def test_an_unsigned_request_is_refused(waiting) -> None:
    approval = waiting()
    body = urllib.parse.urlencode({"payload": json.dumps(payload(approval, "U0RITA"))})
    assert Client().post(URL, body, content_type="application/x-www-form-urlencoded").status_code == 401
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_a_replayed_request_with_an_old_timestamp_decides_nothing(waiting) -> None:
    linked("rita", "U0RITA")
    approval = waiting()
    # Correctly signed, six minutes ago: a captured request replayed.
    response = post(payload(approval, "U0RITA"), timestamp=int(time.time()) - 6 * 60)
    assert response.status_code == 401
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not SlackAction.objects.exists()


def test_a_signed_request_that_is_not_an_airlock_button_is_a_400(waiting) -> None:
    approval = waiting()
    bad = payload(approval, "U0RITA")
    bad["actions"][0]["value"] = "{not json"
    assert post(bad).status_code == 400
    assert post({"type": "view_submission"}).status_code == 400
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_an_unlinked_slack_user_is_told_why_and_the_click_is_logged(waiting, receiver) -> None:
    linked("rita", "U0RITA")
    approval = waiting()
    assert post(payload(approval, "U0STRANGER", response_url=receiver.url)).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    [message] = answers(receiver)
    assert message["response_type"] == "ephemeral" and message["replace_original"] is False
    assert "not linked" in message["text"]
    row = SlackAction.objects.get()
    assert (row.member_id, row.user, row.outcome) == ("U0STRANGER", None, "refused: unlinked Slack user")


def test_a_linked_user_who_is_not_a_reviewer_decides_nothing(waiting, receiver) -> None:
    linked("otto", "U0OTTO", "operator")
    approval = waiting()
    post(payload(approval, "U0OTTO", response_url=receiver.url))
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert "may not decide" in answers(receiver)[0]["text"]


def test_the_launcher_is_kept_from_approving_their_own_run_under_separation_of_duties(waiting, receiver) -> None:
    lara = linked("lara", "U0LARA", "launcher", "reviewer")
    approval = waiting(user=lara, policy={"separate_duties": True})
    post(payload(approval, "U0LARA", response_url=receiver.url))
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not approval.votes.exists()
    [message] = answers(receiver)
    assert message["response_type"] == "ephemeral"
    assert "separates duties" in message["text"]
    assert SlackAction.objects.get().outcome == "refused: separation of duties"


TWO_VOTES = {"rules": [{"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people"}]}


def test_a_stale_button_after_an_edit_is_refused_and_says_the_call_changed(waiting, receiver) -> None:
    linked("rita", "U0RITA")
    rob = person("rob", "reviewer")
    approval = waiting(policy=TWO_VOTES)
    shown = approval.args_hash  # what the Slack message carried
    edited = approval_decide(
        approval_id=approval.pk, user=rob, decision="approve", args={"entry": "edited by rob"}, args_hash=shown
    )
    assert edited.outcome == "voted"
    post(payload(approval, "U0RITA", args_hash=shown, response_url=receiver.url))
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert [v.by_name for v in approval.votes.all()] == ["rob"]
    [message] = answers(receiver)
    assert "call changed" in message["text"]
    assert SlackAction.objects.get().outcome == "refused: call changed"


def test_a_click_is_one_vote_of_a_two_person_rule(waiting, receiver) -> None:
    linked("rita", "U0RITA")
    linked("rob", "U0ROB")
    approval = waiting(policy=TWO_VOTES)
    post(payload(approval, "U0RITA", response_url=receiver.url, action_ts="1.1"))
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert "1 of 2" in answers(receiver)[0]["text"]
    post(payload(approval, "U0ROB", response_url=receiver.url, action_ts="1.2"))
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert sorted(v.by_name for v in approval.votes.all()) == ["rita", "rob"]


def test_a_retried_delivery_decides_nothing_twice(waiting, receiver) -> None:
    linked("rita", "U0RITA")
    approval = waiting(policy=TWO_VOTES)
    click = payload(approval, "U0RITA", response_url=receiver.url)
    assert post(click).status_code == 200
    assert post(click, retry="1").status_code == 200
    assert post(click, retry="2").status_code == 200
    assert SlackAction.objects.count() == 1
    assert approval.votes.count() == 1
    assert len(receiver.requests) == 1  # the retries were answered, and nothing more said


def test_a_click_on_an_expired_or_decided_call_says_so(waiting, receiver) -> None:
    linked("rita", "U0RITA")
    rob = person("rob", "reviewer")
    approval = waiting()
    approval_decide(approval_id=approval.pk, user=rob, decision="reject", args_hash=approval.args_hash)
    post(payload(approval, "U0RITA", response_url=receiver.url))
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.via) == ("rejected", rob, "dashboard")
    [message] = answers(receiver)
    assert "rejected by rob via dashboard" in message["text"]


def test_a_slow_database_never_holds_the_answer_and_the_outcome_follows(settings, waiting, receiver) -> None:
    """Slack retries what it has no answer to within 3 s: the answer does not wait for a
    database that is slow (here: the run's row locked by another transaction); the
    decision lands when the lock goes, through the response_url. (SQLite's busy timeout
    is 20 s: the decision waits on the lock there as it does on PostgreSQL.)"""
    settings.AIRLOCK_SLACK_ANSWER_SECONDS = 0.05
    linked("rita", "U0RITA")
    approval = waiting()
    locker = connections.create_connection("default")
    try:
        with locker.cursor() as cursor:
            if locker.vendor == "postgresql":
                cursor.execute("BEGIN")
                cursor.execute("SELECT id FROM agents_run WHERE id = %s FOR UPDATE", [approval.run_id])
            else:  # SQLite has no row locks: its write lock holds every writer, the decision's too
                cursor.execute("BEGIN IMMEDIATE")
            response = post(payload(approval, "U0RITA", response_url=receiver.url))
            assert response.status_code == 200
            assert Approval.objects.get(pk=approval.pk).status == "pending"  # still waiting on the lock
            cursor.execute("COMMIT")
    finally:
        locker.close()
    slack.wait_idle()
    assert Approval.objects.get(pk=approval.pk).status == "approved"
    assert answers(receiver)[0]["replace_original"] is True


def test_fifty_identical_clicks_and_a_dashboard_click_at_once_run_the_call_once(pending, receiver, drive) -> None:
    linked("rita", "U0RITA")
    rob = person("rob", "reviewer")
    # The unsafe ledger adds a row every time it runs: two executions would show.
    approval = pending(
        [call("fetch_fixture", text=PLANTED), call("ledger_write_unsafe", entry="paid once"), final("ok")]
    )
    dashboard = CsrfClient()
    dashboard.force_login(rob)
    dashboard.token()
    # Half the clicks are one delivery retried, half a reviewer hammering the button.
    clicks = [payload(approval, "U0RITA", response_url=receiver.url, action_ts=f"9.{i % 2 and i}") for i in range(50)]

    def answer(i: int) -> int:
        if i == 50:
            return dashboard.decide(approval.pk, "approve", args_hash=approval.args_hash).status_code
        return post(clicks[i]).status_code

    codes = at_once(answer, list(range(51)))
    slack.wait_idle()
    assert set(codes) <= {200, 303}
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert Transition.objects.filter(run=approval.run, kind="decision").count() == 1
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done"
    assert LedgerEntry.objects.filter(run=run).count() == 1


def test_pending_messages_carry_buttons_bound_to_the_call_and_a_link(waiting) -> None:
    approval = waiting()
    data = json.loads(json.dumps(approval.to_dict(), default=str))
    data["url"] = delivery.approval_url(approval.pk)
    message = delivery.slack_message("approval.pending", data)
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    assert [e["text"]["text"] for e in actions["elements"]] == ["Approve", "Reject"]
    assert {json.loads(e["value"])["args_hash"] for e in actions["elements"]} == {approval.args_hash}
    assert data["url"] in json.dumps(message)
    decided = delivery.slack_message("approval.decided", {**data, "status": "approved"})
    assert not [b for b in decided["blocks"] if b["type"] == "actions"]


def test_a_message_is_rewritten_when_the_call_is_decided_in_the_dashboard(waiting, receiver) -> None:
    linked("rita", "U0RITA")
    rob = person("rob", "reviewer")
    approval = waiting(policy=TWO_VOTES)
    post(payload(approval, "U0RITA", response_url=receiver.url))  # a vote: the message keeps its buttons
    assert slack.update_decided() == 0
    approval_decide(approval_id=approval.pk, user=rob, decision="reject", args_hash=approval.args_hash)
    assert slack.update_decided() == 1
    assert slack.update_decided() == 0  # once
    message = answers(receiver)[-1]
    assert message["replace_original"] is True and "rejected by rob via dashboard" in message["text"]


# -- linking a Slack identity: only with proof (issue 46, item 2) ------------------------


def proof_link(message: dict[str, Any]) -> str:
    """The path of the proof link in an ephemeral reply to an unlinked member's click."""
    import re

    [path] = re.findall(r"https://airlock\.example\.org(/account/slack/link/[^/\s]+/)", message["text"])
    return path


def test_typing_another_reviewers_member_id_links_nothing_and_her_clicks_still_decide_as_her(waiting, receiver) -> None:
    """The probe: rob typed rita's member id on his notifications page; her next Approve
    was recorded as rob's. A typed id now changes no link."""
    rita = linked("rita", "U0RITA")
    rob = person("rob", "reviewer")
    lara = person("lara", "launcher")
    for thief in (rob, lara):
        page = CsrfClient()
        page.force_login(thief)
        response = page.post(
            "/account/notifications/", {"email_digest": "on", "slack_member_id": "U0RITA"},
            headers={"X-CSRFToken": page.token()},
        )
        assert response.status_code == 302
        assert "only with proof" in page.get("/account/notifications/").content.decode()
        assert slack.linked_user("U0RITA") == rita
        assert not NotificationPreference.objects.get(user=thief).slack_member_id
    approval = waiting()
    post(payload(approval, "U0RITA", response_url=receiver.url))
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", rita)


def test_an_unlinked_members_click_shows_them_alone_a_link_that_links_whoever_opens_it_once(waiting, receiver) -> None:
    rob = person("rob", "reviewer")
    first = waiting()
    post(payload(first, "U0ROB", response_url=receiver.url))
    [message] = answers(receiver)
    assert message["response_type"] == "ephemeral" and first.status == "pending"
    path = proof_link(message)
    page = CsrfClient()
    page.force_login(rob)
    shown = page.get(path)
    assert shown.status_code == 200 and "U0ROB" in shown.content.decode()
    assert "u0rob" in shown.content.decode()  # the Slack username the click carried
    assert "If someone sent you this link, do not" in shown.content.decode()
    assert slack.linked_user("U0ROB") is None  # opening it changes nothing
    assert page.post(path, {}, headers={"X-CSRFToken": page.token()}).status_code == 302
    assert slack.linked_user("U0ROB") == rob
    # Spent: the member's link changed since it was made.
    assert page.post(path, {}, headers={"X-CSRFToken": page.token()}).status_code == 410
    forged = path.replace("/link/", "/link/x")
    assert page.get(forged).status_code == 410
    # The message clicked before the link decides nothing; a new one decides as rob.
    post(payload(first, "U0ROB", action_ts="1700000000.000200", response_url=receiver.url))
    assert Approval.objects.get(pk=first.pk).status == "pending"
    assert SlackAction.objects.get(action_ts="1700000000.000200").outcome == "refused: link changed"
    second = waiting(entry="another")
    post(payload(second, "U0ROB", action_ts="1700000000.000300", response_url=receiver.url))
    second.refresh_from_db()
    assert (second.status, second.decided_by, second.via) == ("approved", rob, "slack")


def test_a_moved_link_tells_the_previous_owner(defaults, mailoutbox) -> None:
    rita = linked("rita", "U0RITA")
    rita.email = "rita@example.org"
    rita.save()
    linked("rob", "U0RITA")  # an admin moves it (link_slack)
    assert slack.linked_user("U0RITA").username == "rob"
    [mail] = mailoutbox
    assert mail.to == ["rita@example.org"]
    assert "U0RITA" in mail.body and "rob" in mail.body and "no longer decide as you" in mail.body
    assert not NotificationPreference.objects.get(user=rita).slack_member_id


def test_a_click_on_a_message_sent_before_the_members_link_changed_decides_nothing(waiting, receiver) -> None:
    """rita's member id moved to rob after the message went out: that message's buttons,
    clicked by the member, decide nothing (neither as rob nor as rita)."""
    linked("rita", "U0SHARED")
    approval = waiting()
    event = OutboxEvent.objects.get(approval=approval, type="approval.pending")
    event.data = delivery.render(event)
    message = json.loads(delivery.body(event, Webhook(format="slack", url="https://hooks.example.org/x")))
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    value = json.loads(actions["elements"][0]["value"])
    assert value["sent"] == round(event.created_at.timestamp(), 3)
    linked("rob", "U0SHARED", "reviewer")
    click = payload(approval, "U0SHARED", response_url=receiver.url)
    click["actions"][0]["value"] = json.dumps(value)
    post(click)
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not approval.votes.exists()
    assert SlackAction.objects.get().outcome == "refused: link changed"
    assert "after this message was sent" in answers(receiver)[0]["text"]
    # Without the message's time, the call's creation stands in: refused as well.
    post(payload(approval, "U0SHARED", action_ts="1700000000.000900"))
    assert Approval.objects.get(pk=approval.pk).status == "pending"