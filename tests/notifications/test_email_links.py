"""Deciding from email (issue 27): each call in a digest or a per-call email carries a
link for one reviewer, one approval and the call as mailed. Opening it (what mail
scanners do to every link) decides nothing; its page's POST decides once, as that
reviewer. The mail goes through a real SMTP server on loopback (aiosmtpd)."""

from __future__ import annotations

import datetime as dt
import email
import re
import socket
from email import policy as email_policy
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents.actions.approvals import approval_decide
from agents.models import AgentProfile, Approval, ApprovalVote, DecisionLink, LedgerEntry, NotificationPreference
from agents.notifications import delivery
from tests.helpers import CsrfClient, call, final, person

pytestmark = pytest.mark.django_db

LINK = re.compile(r"https://airlock\.example\.org(/reviews/links/[A-Za-z0-9_-]+/)")
TWO_VOTES = {"rules": [{"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people"}]}


class Sink:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's naming
        self.messages.append(email.message_from_bytes(envelope.content, policy=email_policy.default))
        return "250 OK"

    def links(self) -> list[str]:
        return [m for msg in self.messages for m in LINK.findall(msg.get_content())]


@pytest.fixture
def smtp(settings: Any) -> Any:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    yield sink
    controller.stop()


def reviewer(name: str) -> User:
    user = person(name, "reviewer")
    user.email = f"{name}@example.org"
    user.save()
    return user


def mail_digest() -> None:
    assert delivery.send_digest(now=timezone.now() + dt.timedelta(hours=1)) >= 1


def post(client: Client, path: str, decision: str, note: str = "") -> Any:
    client.get(path)  # the page hands out the CSRF token, as a browser gets it
    token = client.cookies["csrftoken"].value
    return client.post(path, {"decision": decision, "note": note, "csrfmiddlewaretoken": token})


def test_a_scanner_that_fetches_every_link_of_a_digest_decides_nothing(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    approvals = [waiting(entry=f"entry {i}") for i in range(3)]
    mail_digest()
    links = smtp.links()
    assert len(links) == 3
    scanner = Client(enforce_csrf_checks=True)
    for path in links:
        for _ in range(2):  # scanners fetch, and fetch again
            page = scanner.get(path)
            assert page.status_code == 200
            text = page.content.decode()
            assert "ledger_write" in text and "Approve" in text and "Reject" in text
            assert "the run has read external content" in text  # the reason
    assert set(Approval.objects.values_list("status", flat=True)) == {"pending"}
    assert not ApprovalVote.objects.exists()
    assert not DecisionLink.objects.exclude(used_at=None).exists()
    assert len(approvals) == 3


def test_the_token_is_stored_only_as_a_hash_and_is_long(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    waiting()
    mail_digest()
    [path] = smtp.links()
    token = path.rstrip("/").rsplit("/", 1)[1]
    assert len(token) >= 43
    row = DecisionLink.objects.get()
    assert token not in row.token_hash and row.token_hash != token


@pytest.mark.django_db(transaction=True)  # the tool runs on its own connection
def test_the_pages_post_decides_once_as_the_bound_reviewer(loopback_allowed, smtp, waiting, drive) -> None:
    reviewer("rita")
    approval = waiting()
    mail_digest()
    [path] = smtp.links()
    browser = Client(enforce_csrf_checks=True)  # not logged in: the link is the credential
    response = post(browser, path, "approve", note="fine by me")
    assert response.status_code == 303
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by.username, approval.via, approval.note) == (
        "approved",
        "rita",
        "email",
        "fine by me",
    )
    assert drive(approval.run).state == "done"
    assert LedgerEntry.objects.filter(run=approval.run).count() == 1
    # Used: a second use says so and records nothing.
    again = post(browser, path, "reject")
    assert again.status_code == 410
    assert "already used" in again.content.decode()
    assert ApprovalVote.objects.count() == 1
    assert "already used (approved)" in browser.get(path).content.decode()


@pytest.mark.parametrize(
    ("decision", "policy", "said"),
    [
        ("approve", None, "; it will run now."),
        ("reject", None, "; it will not run, and the agent is told it was rejected."),
        ("approve", TWO_VOTES, ": 1 of 2 approvals so far; the call waits for another reviewer."),
    ],
)
def test_the_page_after_deciding_says_what_you_did_and_a_later_visit_that_the_link_is_spent(
    loopback_allowed, smtp, waiting, decision, policy, said
) -> None:
    """The probe: right after a successful click, the page said "This link was already
    used (approved); it works once" with a 410, as if the click had not counted."""
    reviewer("rita")
    approval = waiting(policy=policy) if policy else waiting()
    mail_digest()
    [path] = smtp.links()
    browser = Client(enforce_csrf_checks=True)
    response = post(browser, path, decision)
    assert response.status_code == 303 and response["Location"] == path
    page = browser.get(path)
    text = page.content.decode()
    assert page.status_code == 200, text[:500]
    assert "already used" not in text
    approval.refresh_from_db()
    at = timezone.localtime(approval.decided_at or ApprovalVote.objects.get().at)
    verb = {"approve": "approved", "reject": "rejected"}[decision] if policy is None else f"vote to {decision}"
    assert f"You {verb}" in text or f"Your {verb}" in text
    assert f"{at:%H:%M}" in text and said in text
    assert '<form method="post" class="link-decision">' not in text  # nothing left to answer here
    later = browser.get(path)
    assert later.status_code == 410 and "already used" in later.content.decode()


def test_a_logged_in_user_who_is_not_the_bound_reviewer_decides_nothing(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    rob = reviewer("rob")
    approval = waiting()
    mail_digest()
    rita_links = [m for m in smtp.messages if m["To"] == "rita@example.org"]
    [path] = LINK.findall(rita_links[0].get_content())
    browser = CsrfClient()
    browser.force_login(rob)
    page = browser.get(path)
    assert page.status_code == 403
    assert "sent to rita" in page.content.decode()
    assert 'value="approve"' not in page.content.decode()
    assert post(browser, path, "approve").status_code == 403
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not ApprovalVote.objects.exists()


def test_a_link_dies_when_the_call_is_edited(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    rob = person("rob", "reviewer")
    approval = waiting(policy=TWO_VOTES)
    mail_digest()
    [path] = smtp.links()
    approval_decide(
        approval_id=approval.pk, user=rob, decision="approve", args={"entry": "rob's"}, args_hash=approval.args_hash
    )
    browser = Client(enforce_csrf_checks=True)
    assert "call changed" in browser.get(path).content.decode()
    response = post(browser, path, "approve")
    assert response.status_code == 409
    assert [v.by_name for v in Approval.objects.get(pk=approval.pk).votes.all()] == ["rob"]


def test_a_link_to_a_call_decided_elsewhere_says_who_decided(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    rob = person("rob", "reviewer")
    approval = waiting()
    mail_digest()
    [path] = smtp.links()
    approval_decide(approval_id=approval.pk, user=rob, decision="reject", args_hash=approval.args_hash)
    response = post(Client(enforce_csrf_checks=True), path, "approve")
    assert response.status_code == 409
    assert "rejected by rob via dashboard" in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "rejected"


def test_a_link_expires_after_its_hours(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    approval = waiting()
    mail_digest()
    [path] = smtp.links()
    DecisionLink.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    response = post(Client(enforce_csrf_checks=True), path, "approve")
    assert response.status_code == 410
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_an_unknown_token_is_a_404_page(defaults) -> None:
    assert Client().get("/reviews/links/not-a-real-token/").status_code == 404
    assert Client().post("/reviews/links/x/", {"decision": "approve"}).status_code in (403, 404)


STEP_UP = {"rules": [{"tool": "ledger_write", "then": "ask", "step_up": True, "reason": "money moves"}]}


def test_a_call_that_needs_step_up_asks_the_bound_reviewer_to_log_in(loopback_allowed, smtp, waiting) -> None:
    rita = reviewer("rita")
    approval = waiting(policy=STEP_UP)
    mail_digest()
    [path] = smtp.links()
    assert "log in first" in smtp.messages[0].get_content()
    browser = Client(enforce_csrf_checks=True)
    page = browser.get(path).content.decode()
    assert "cannot be decided through a link alone" in page and 'value="approve"' not in page
    response = post(browser, path, "approve")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    browser.force_login(rita)  # their own session
    assert 'value="approve"' in browser.get(path).content.decode()
    assert post(browser, path, "approve").status_code == 303
    approval.refresh_from_db()
    assert (approval.status, approval.via) == ("approved", "email")


def test_an_irreversible_call_asks_for_login_before_deciding(loopback_allowed, smtp, launch, drive) -> None:
    rita = reviewer("rita")
    AgentProfile.objects.create(name="payer", provider="scripted", tools=["refund"], separate_duties=False)
    run = drive(launch([call("refund", order_id="#1042", amount=50, reason="late"), final()], agent="payer"))
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.risk == "irreversible"
    mail_digest()
    [path] = smtp.links()
    browser = Client(enforce_csrf_checks=True)
    assert "cannot be decided through a link alone" in browser.get(path).content.decode()
    response = post(browser, path, "approve")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    browser.force_login(rita)
    assert post(browser, path, "reject").status_code == 303
    assert Approval.objects.get(pk=approval.pk).status == "rejected"


def test_a_reviewer_can_ask_for_one_email_per_call_with_its_link(loopback_allowed, smtp, waiting) -> None:
    rita = reviewer("rita")
    NotificationPreference.objects.create(user=rita, email_each_call=True)
    first, second = waiting(entry="one"), waiting(entry="two")
    assert delivery.send_call_emails() == 2
    assert delivery.send_call_emails() == 0  # once each
    assert len(smtp.links()) == 2
    assert delivery.send_digest(now=timezone.now() + dt.timedelta(hours=1)) == 0  # the digest repeats nothing
    assert {first.pk, second.pk} == set(DecisionLink.objects.values_list("approval_id", flat=True))


def test_the_launcher_under_separation_of_duties_gets_no_working_link(loopback_allowed, smtp, waiting) -> None:
    lara = person("lara", "launcher", "reviewer")
    lara.email = "lara@example.org"
    lara.save()
    approval = waiting(user=lara, policy={"separate_duties": True})
    from agents.notifications.links import link_create, link_url

    path = link_url(link_create(user=lara, approval=approval)).removeprefix("https://airlock.example.org")
    response = post(Client(enforce_csrf_checks=True), path, "approve")
    assert response.status_code == 403
    assert "separates duties" in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.django_db(transaction=True)  # the tool runs on its own connection
def test_unsafe_calls_run_once_whatever_the_link_is_posted(loopback_allowed, smtp, pending, drive) -> None:
    reviewer("rita")
    approval = pending([call("fetch_fixture", text="external"), call("ledger_write_unsafe", entry="once"), final()])
    mail_digest()
    [path] = smtp.links()
    browser = Client(enforce_csrf_checks=True)
    codes = [post(browser, path, "approve").status_code for _ in range(3)]
    assert codes == [303, 410, 410]
    drive(Approval.objects.get(pk=approval.pk).run)
    assert LedgerEntry.objects.filter(run=approval.run).count() == 1


def test_the_confirm_page_shows_the_call_as_inert_text(loopback_allowed, smtp, waiting) -> None:
    reviewer("rita")
    waiting(entry='<script>alert("pwned")</script>')
    mail_digest()
    [path] = smtp.links()
    html = Client().get(path).content.decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(" in html and "&lt;/script&gt;" in html
