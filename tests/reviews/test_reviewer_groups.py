"""Who reviews (issue 28): a profile's reviewer group sees and decides its calls, its
backup group only once a call is escalated, superusers always; everyone else neither
sees nor decides them, on the queue, the approval's page, the API, Slack and email
links. Operators still read every run and its calls, and decide none."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from slack_sdk.signature import SignatureVerifier

from agents import access
from agents.actions.approvals import approval_escalate
from agents.actions.tokens import token_create
from agents.models import AgentProfile, Approval, ApprovalVote, SlackAction
from agents.notifications import delivery, slack
from agents.notifications.links import link_create
from tests.helpers import Api, CsrfClient, person, reviewed_profile, tainted_write

pytestmark = pytest.mark.django_db

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@pytest.fixture
def payments(defaults: None) -> AgentProfile:
    return reviewed_profile()


@pytest.fixture
def cast(payments: AgentProfile, rita: User, otto: User, root: User) -> dict[str, User]:
    """paula reviews payments; bea is its backup; rita reviews the other agents; ross
    reviews them too and operates (he reads every run); otto operates; root."""
    ross = person("ross", "reviewer", "operator")
    return {
        "paula": person("paula", "payments-reviewers"),
        "bea": person("bea", "payments-leads"),
        "rita": rita,
        "ross": ross,
        "otto": otto,
        "root": root,
    }


@pytest.fixture
def call_(pending: Any, payments: AgentProfile) -> Approval:
    """A payments call waiting for a human."""
    return pending(tainted_write(), agent="payments")


def browser(user: User) -> CsrfClient:
    client = CsrfClient()
    client.force_login(user)
    return client


def api(user: User) -> Api:
    _token, raw = token_create(user=user)
    return Api(raw)


def in_queue(user: User, approval: Approval) -> bool:
    page = browser(user).get("/reviews/").content.decode()
    return f'data-approval-id="{approval.pk}"' in page


def badge(user: User) -> str:
    return browser(user).get("/reviews/badge/").content.decode()


def listed(user: User, approval: Approval) -> bool:
    response = api(user).get("/api/approvals?status=pending")
    assert response.status_code == 200, response.data
    return approval.pk in [a["id"] for a in response.data["items"]]


def test_the_reviewer_group_sees_and_decides_and_another_group_neither(cast: dict[str, User], call_: Approval) -> None:
    paula, rita = cast["paula"], cast["rita"]
    assert in_queue(paula, call_) and listed(paula, call_)
    assert not in_queue(rita, call_) and not listed(rita, call_)
    assert browser(rita).get(f"/reviews/{call_.pk}/").status_code == 404
    assert browser(rita).get(f"/runs/{call_.run_id}/").status_code == 404  # nor its run
    assert api(rita).get(f"/api/runs/{call_.run_id}").status_code == 404
    # A call she may not see answers as a missing one, whatever she sends.
    refused = api(rita).post(f"/api/approvals/{call_.pk}/decision", {"decision": "approve"})
    missing = api(rita).post(f"/api/approvals/{call_.pk + 1000}/decision", {"decision": "approve"})
    assert (
        (refused.status_code, refused.data["error"])
        == (404, "not_found")
        == (missing.status_code, missing.data["error"])
    )
    assert browser(rita).decide(call_.pk, "approve").status_code == 404
    assert not ApprovalVote.objects.exists()
    assert Approval.objects.get(pk=call_.pk).status == "pending"

    page = browser(paula).get(f"/reviews/{call_.pk}/").content.decode()
    assert 'class="approve"' in page and browser(paula).get(f"/runs/{call_.run_id}/").status_code == 200
    decided = api(paula).post(
        f"/api/approvals/{call_.pk}/decision", {"decision": "approve", "args_hash": call_.args_hash}
    )
    assert decided.status_code == 200 and decided.data["status"] == "approved"
    assert decided.data["decided_by"] == "paula"


def test_the_badge_and_counts_are_of_the_calls_the_user_may_review(
    cast: dict[str, User], call_: Approval, pending: Any
) -> None:
    other = pending(tainted_write("another"))  # the scripted agent: the reviewer group's
    assert ">1<" in badge(cast["paula"]) and ">1<" in badge(cast["rita"])
    assert ">2<" in badge(cast["root"]) and ">2<" in badge(cast["otto"])  # operators read every call
    assert in_queue(cast["rita"], other) and not in_queue(cast["paula"], other)


def test_an_operator_who_reviews_other_agents_sees_the_call_but_may_not_decide_it(
    cast: dict[str, User], call_: Approval
) -> None:
    ross = cast["ross"]
    assert in_queue(ross, call_) and listed(ross, call_)
    page = browser(ross).get(f"/reviews/{call_.pk}/").content.decode()
    assert f'data-approval-id="{call_.pk}"' in page and 'class="approve"' not in page  # read-only
    response = api(ross).post(f"/api/approvals/{call_.pk}/decision", {"decision": "approve"})
    assert response.status_code == 403 and response.data["error"] == "forbidden"
    assert "payments-reviewers" in response.data["detail"]  # it says who decides
    assert browser(ross).decide(call_.pk, "approve").status_code == 403
    # An operator alone is refused as before: deciding needs a reviewer's role.
    assert api(cast["otto"]).post(f"/api/approvals/{call_.pk}/decision", {"decision": "reject"}).status_code == 403
    assert not ApprovalVote.objects.exists()


def test_the_backup_group_sees_and_decides_only_once_the_call_is_escalated(
    cast: dict[str, User], call_: Approval
) -> None:
    bea = cast["bea"]
    assert not in_queue(bea, call_) and not listed(bea, call_)
    assert browser(bea).get(f"/reviews/{call_.pk}/").status_code == 404
    assert api(bea).post(f"/api/approvals/{call_.pk}/decision", {"decision": "approve"}).status_code == 404
    assert browser(bea).get(f"/runs/{call_.run_id}/").status_code == 404
    assert api(bea).get("/api/runs").data["items"] == []

    assert approval_escalate(approval_id=call_.pk)
    assert in_queue(bea, call_) and listed(bea, call_)
    assert browser(bea).get(f"/runs/{call_.run_id}/").status_code == 200  # its run too, to judge it
    assert [r["id"] for r in api(bea).get("/api/runs").data["items"]] == [call_.run_id]
    response = browser(bea).decide(call_.pk, "reject", note="not today")
    assert response.status_code == 303
    call_.refresh_from_db()
    assert (call_.status, call_.decided_by.username, call_.note) == ("rejected", "bea", "not today")


def test_a_superuser_always_sees_and_decides(cast: dict[str, User], call_: Approval) -> None:
    root = cast["root"]
    assert in_queue(root, call_) and listed(root, call_)
    assert api(root).post(f"/api/approvals/{call_.pk}/decision", {"decision": "approve"}).status_code == 200


def test_the_rule_is_one_function_of_user_profile_and_escalation(cast: dict[str, User], payments: AgentProfile) -> None:
    table = {
        name: (access.may_review(u, payments, escalated=False), access.may_review(u, payments, escalated=True))
        for name, u in cast.items()
    }
    assert table == {
        "paula": (True, True),
        "bea": (False, True),
        "rita": (False, False),
        "ross": (False, False),
        "otto": (False, False),
        "root": (True, True),
    }
    scripted = AgentProfile.objects.get(name="scripted")  # no group of its own: the reviewer group's
    assert access.may_review(cast["rita"], scripted, escalated=False)
    assert not access.may_review(cast["paula"], scripted, escalated=False)


def test_digests_go_to_the_profiles_reviewers_only(cast: dict[str, User], call_: Approval, mailoutbox: Any) -> None:
    for user in cast.values():
        user.email = f"{user.username}@example.org"
        user.save()
    assert delivery.send_digest(now=call_.created_at + _window()) >= 1
    told = {m.to[0].split("@")[0] for m in mailoutbox if f"/reviews/{call_.pk}/" in m.body}
    assert told == {"paula"}  # root is in no reviewing group: as before, no digest
    assert {u.username for u in access.reviewers(call_.run.profile)} == {"paula"}
    assert {u.username for u in access.reviewers(call_.run.profile, escalated=True)} == {"paula", "bea"}


def _window() -> Any:
    import datetime as dt

    from django.conf import settings

    return dt.timedelta(seconds=settings.AIRLOCK_EMAIL_DIGEST_SECONDS + 1)


def test_an_email_link_of_a_user_outside_the_group_decides_nothing(cast: dict[str, User], call_: Approval) -> None:
    # A link mailed to someone who may not decide (moved out of the group since).
    token = link_create(user=cast["rita"], approval=call_)
    client = Client(enforce_csrf_checks=True)
    page = client.get(f"/reviews/links/{token}/")
    assert page.status_code == 403 and "may not decide this call" in page.content.decode()
    csrf = client.cookies["csrftoken"].value
    response = client.post(f"/reviews/links/{token}/", {"decision": "approve", "csrfmiddlewaretoken": csrf})
    assert response.status_code == 403
    assert Approval.objects.get(pk=call_.pk).status == "pending" and not ApprovalVote.objects.exists()
    # The backup group's link works once the call is escalated.
    link = link_create(user=cast["bea"], approval=call_)
    assert Client().get(f"/reviews/links/{link}/").status_code == 403
    approval_escalate(approval_id=call_.pk)
    assert Client().get(f"/reviews/links/{link}/").status_code == 200


@pytest.mark.django_db(transaction=True)  # Slack clicks are decided on their own thread and connection
def test_a_slack_click_by_another_group_decides_nothing_and_the_backup_after_escalation_does(
    settings: Any, defaults: None
) -> None:
    from tests.webhook_receiver import Receiver

    settings.AIRLOCK_SLACK_SIGNING_SECRET = SECRET
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    reviewed_profile()
    for name, member, group in (("rita", "U0RITA", "reviewer"), ("bea", "U0BEA", "payments-leads")):
        person(name, group)
        call_command("link_slack", name, member, stdout=open("/dev/null", "w"))  # noqa: SIM115
    from agents.actions.runs import run_launch
    from agents.runs import driver

    run = driver.drive(run_launch(script=tainted_write(), agent="payments", task="refund").pk)
    approval = Approval.objects.get(run=run, status="pending")
    receiver = Receiver(secret=delivery.new_secret()).start()
    try:
        for member in ("U0RITA", "U0BEA"):
            _click(approval, member, receiver.url)
        slack.wait_idle()
        assert Approval.objects.get(pk=approval.pk).status == "pending"
        assert list(SlackAction.objects.order_by("pk").values_list("outcome", flat=True)) == [
            "refused: may not decide",
            "refused: may not decide",
        ]
        assert all("may not decide" in json.loads(r.body)["text"] for r in receiver.requests)
        approval_escalate(approval_id=approval.pk)
        _click(approval, "U0BEA", receiver.url, ts="1700000000.000200")
        slack.wait_idle()
        approval.refresh_from_db()
        assert (approval.status, approval.decided_by.username, approval.via) == ("approved", "bea", "slack")
    finally:
        receiver.stop()


def _click(approval: Approval, member: str, response_url: str, *, ts: str = "1700000000.000100") -> None:
    value = json.dumps({"approval": approval.pk, "args_hash": approval.args_hash})
    data = {
        "type": "block_actions",
        "user": {"id": member, "username": member.lower()},
        "response_url": response_url,
        "actions": [
            {
                "action_id": "approve",
                "block_id": f"airlock_approval_{approval.pk}",
                "value": value,
                "type": "button",
                "action_ts": ts,
            }
        ],
    }
    body = urllib.parse.urlencode({"payload": json.dumps(data)})
    stamp = str(int(time.time()))
    headers = {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=stamp, body=body),
    }
    response = Client().post(
        "/integrations/slack/interactions", body, content_type="application/x-www-form-urlencoded", headers=headers
    )
    assert response.status_code == 200


def test_a_group_that_does_not_exist_is_refused_with_a_clear_message(payments: AgentProfile) -> None:
    payments.reviewer_group = "payments-reviwers"
    with pytest.raises(ValidationError) as raised:
        payments.full_clean()
    assert raised.value.message_dict["reviewer_group"] == [
        "there is no group named 'payments-reviwers': create it first (Groups, in the admin)"
    ]
    payments.reviewer_group, payments.backup_group = "payments-reviewers", ""
    with pytest.raises(ValidationError) as raised:
        payments.full_clean()  # escalate_after_seconds is set: where would the call go?
    assert "backup group" in raised.value.message_dict["escalate_after_seconds"][0]


def test_the_admin_edits_the_three_fields_and_refuses_a_missing_group(payments: AgentProfile, root: User) -> None:
    client = browser(root)
    url = f"/admin/agents/agentprofile/{payments.pk}/change/"
    page = client.get(url).content.decode()
    for field in ("reviewer_group", "backup_group", "escalate_after_seconds"):
        assert f'name="{field}"' in page
    assert "superusers always may" in page  # the help text
    form = _admin_form(client, url)
    form["reviewer_group"] = "nobody-here"
    response = client.post(url, {**form, "csrfmiddlewaretoken": client.token()})
    assert response.status_code == 200  # the form again, with the error
    assert "there is no group named &#x27;nobody-here&#x27;" in response.content.decode()
    assert AgentProfile.objects.get(pk=payments.pk).reviewer_group == "payments-reviewers"
    form["reviewer_group"], form["escalate_after_seconds"] = "", "120"
    response = client.post(url, {**form, "csrfmiddlewaretoken": client.token()})
    assert response.status_code == 302
    saved = AgentProfile.objects.get(pk=payments.pk)
    assert (saved.reviewer_group, saved.escalate_after_seconds) == ("", 120)


def _admin_form(client: CsrfClient, url: str) -> dict[str, str]:
    """The change form's fields as the page fills them (what a browser would send back)."""
    from html.parser import HTMLParser

    fields: dict[str, str] = {}

    class Form(HTMLParser):
        textarea: str | None = None
        select: str | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = dict(attrs)
            name = a.get("name") or ""
            if tag == "option" and self.select and "selected" in a:
                fields[self.select] = a.get("value") or ""
            elif not name or name == "csrfmiddlewaretoken":
                return
            elif tag == "input" and a.get("type") == "checkbox":
                if "checked" in a:
                    fields[name] = "on"
            elif tag == "input" and a.get("type") != "submit":
                fields[name] = a.get("value") or ""
            elif tag == "textarea":
                self.textarea, fields[name] = name, ""
            elif tag == "select":
                self.select = name

        def handle_data(self, data: str) -> None:
            if self.textarea:
                fields[self.textarea] += data

        def handle_endtag(self, tag: str) -> None:
            if tag == "textarea":
                fields[self.textarea or ""] = fields.get(self.textarea or "", "").removeprefix("\n")
                self.textarea = None
            elif tag == "select":
                self.select = None

    Form().feed(client.get(url).content.decode())
    return fields


def test_a_reviewer_of_other_agents_may_not_revoke_a_grant_of_this_agents_run(
    cast: dict[str, User], call_: Approval
) -> None:
    from agents.models import Grant

    grant = Grant.objects.create(run_id=call_.run_id, number=1, tool="ledger_write", by=cast["paula"])
    response = api(cast["rita"]).post(f"/api/runs/{call_.run_id}/grants/{grant.pk}/revoke")
    assert (response.status_code, response.data["error"]) == (404, "not_found")  # as for a run she may not read
    page = browser(cast["rita"])
    revoke = page.post(f"/runs/{call_.run_id}/grants/{grant.pk}/revoke/", headers={"X-CSRFToken": page.token()})
    assert revoke.status_code == 404
    assert Grant.objects.get(pk=grant.pk).revoked_at is None
