"""One-line fields in notifications (issue 34, item 8): a launcher's rule `reason` with
CR/LF and any length forged an "URGENT, approve at once" entry with an external link in
the reviewers' digest and broke out of the Slack quote. Reasons are made one line and
capped where rules are accepted, and every one-line field is again where it is put into
a notification line."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.engine.text import ONE_LINE_MAX, one_line
from agents.models import AgentProfile, Approval
from agents.notifications import delivery as notify
from tests.helpers import call, final

pytestmark = pytest.mark.django_db

FORGED = (
    "refund check\r\n\r\n- refund (run 1, read): URGENT, approve at once\r\n  https://evil.example/approve\n"
    "\u2028>*Approve now* <https://evil.example|click here>\u202e" + "padding " * 300
)


def entries(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith("- ")]


def test_a_launch_rules_reason_is_stored_as_one_capped_line(launch, drive) -> None:
    policy = {"rules": [{"tool": "ledger_write", "then": "ask", "reason": FORGED}]}
    run = drive(launch([call("ledger_write", entry="x"), final()], policy=policy))
    approval = Approval.objects.get(run=run)
    assert "\n" not in approval.reason and "\r" not in approval.reason and "\u2028" not in approval.reason
    assert approval.reason.startswith("refund check - refund (run 1, read): URGENT")
    assert len(approval.reason) == ONE_LINE_MAX and approval.reason.endswith("…")


def test_the_digest_shows_a_forged_reason_as_part_of_one_entry(loopback_allowed, rita, launch, drive, mailoutbox) -> None:
    policy = {"rules": [{"tool": "ledger_write", "then": "ask", "reason": FORGED}]}
    drive(launch([call("ledger_write", entry="x"), final()], policy=policy))
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    body = mailoutbox[0].body
    assert len(entries(body)) == 1, body
    assert not any(line.strip().startswith("https://evil") for line in body.splitlines()), body


def test_rows_written_before_the_cap_are_one_line_in_the_digest(loopback_allowed, rita, waiting, mailoutbox) -> None:
    # A reason or a model-proposed tool name stored before the rule existed.
    approval = waiting()
    Approval.objects.filter(pk=approval.pk).update(reason=FORGED, tool="ledger_write\n- fake (run 9, read): approve")
    assert notify.send_digest(now=timezone.now() + dt.timedelta(minutes=2)) == 1
    body = mailoutbox[0].body
    assert len(entries(body)) == 1, body
    assert not any(line.strip().startswith("https://evil") for line in body.splitlines()), body


def test_a_forged_reason_stays_inside_the_slack_quote() -> None:
    message = notify.slack_message(
        "approval.pending", {"tool": "refund", "run": 7, "reason": FORGED, "url": "https://airlock.example.org/r"}
    )
    detail = message["blocks"][0]["text"]["text"]
    head, quote = detail.split("\n>")
    assert head == "*`refund`* on run 7 waits for review"
    assert "\n" not in quote and "\u2028" not in quote and "\u202e" not in quote
    assert "<https://evil" not in detail and "&lt;https://evil.example|click here&gt;" in detail
    assert "\n" not in message["text"]


def test_a_multi_line_answer_stays_inside_the_slack_quote() -> None:
    data = {"id": 3, "agent": "demo", "state": "done", "task": "line one\nline two", "answer": "ok\n\n*Approve* <x|y>"}
    detail = notify.slack_message("run.done", data)["blocks"][0]["text"]["text"]
    assert detail == "*Run 3* (demo) done: line one line two\n>ok *Approve* &lt;x|y&gt;"


def test_a_profile_saved_in_the_admin_keeps_its_reasons_one_line(defaults) -> None:
    profile = AgentProfile.objects.get(name="demo")
    profile.rules = [{"tool": "refund", "then": "ask", "reason": "big\r\nrefunds"}]
    profile.full_clean()
    assert profile.rules == [{"tool": "refund", "then": "ask", "reason": "big refunds"}]
    profile.rules = [{"tool": "refund", "then": "ask", "reason": "\r\n\t"}]
    with pytest.raises(ValidationError, match="reason"):
        profile.full_clean()


@pytest.mark.parametrize(
    "text, line",
    [
        ("a\r\nb", "a b"),
        ("  a\x00\x1b[2Kb\x85c\u2029d  ", "a [2Kb c d"),
        ("x" * 500, "x" * (ONE_LINE_MAX - 1) + "…"),
        (None, ""),
        ("plain", "plain"),
    ],
)
def test_one_line(text, line) -> None:
    assert one_line(text) == line
