"""Deciding from Slack: the buttons on `approval.pending` messages, the clicks Slack
sends to `POST /integrations/slack/interactions`, and the messages updated afterwards.

A click decides exactly as a dashboard click does (`agents.actions.approvals.approval_decide`,
`via="slack"`), as the Airlock user who linked the clicking Slack member id, for the
call the message showed (the button carries its `args_hash`). What is added here:

- verification: Slack's signing secret, through slack_sdk's SignatureVerifier (HMAC
  over `v0:{timestamp}:{body}`, constant-time compare, 5 minutes of clock at most);
- once per click: Slack retries a delivery it had no answer to in 3 s with the same
  `action_ts`; the click's `SlackAction` row is unique on (member, action_ts), so a
  retry finds it and decides nothing;
- answering in time: the decision runs in a thread the request waits for at most
  AIRLOCK_SLACK_ANSWER_SECONDS; the outcome always goes to the message's
  `response_url` (Block Kit clicks are answered there, not in the HTTP response);
- updating a message when the call was decided elsewhere (`update_decided()`, run by
  the deliver_notifications task after each dispatch), through the response_url of a
  click on it.

The buttons themselves are part of the message `agents.notifications.delivery` sends.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.mail import send_mail
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.urls import reverse
from django.utils import timezone
from slack_sdk.signature import SignatureVerifier

from agents import access
from agents.actions.approvals import approval_decide
from agents.actions.base import ActionError
from agents.engine import decisions
from agents.engine.text import one_line
from agents.lib import jsonsafe, sanitize
from agents.models import Approval, NotificationPreference, SlackAction
from agents.notifications.delivery import post, slack_escape
from agents.tools.http import Deadline, UrlRefused

log = logging.getLogger("airlock.slack")

ACTIONS = ("approve", "reject")
RESPONSE_URL_LIFETIME_SECONDS = 30 * 60  # Slack: a response_url works 5 times in 30 minutes


class BadInteraction(Exception):
    """A signed request that is not a click Airlock offered: 400, nothing decided."""


@dataclass(frozen=True)
class Click:
    member_id: str
    action_ts: str
    decision: str
    approval_id: int
    args_hash: str
    response_url: str
    # When Airlock made the message (its event's time, in the button), else Slack's
    # message timestamp; None when neither is known (the approval's creation stands in).
    sent: float | None = None
    member_name: str = ""  # the clicker's Slack username, as Slack sent it (shown, never trusted)


def verified(body: bytes, headers: Any) -> bool:
    """True only for a request signed with AIRLOCK_SLACK_SIGNING_SECRET within the
    last 5 minutes; always False while the secret is unset."""
    secret = settings.AIRLOCK_SLACK_SIGNING_SECRET
    timestamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    # The verifier reads the timestamp with int(): anything but digits is refused here,
    # as a missing one is, instead of raising (a 500).
    if not secret or not signature or not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) < 16):
        return False
    return SignatureVerifier(secret).is_valid(body=body, timestamp=timestamp, signature=signature)


def parse(body: bytes) -> Click:
    """The click in a `block_actions` payload (form field `payload`, JSON)."""
    try:
        form = urllib.parse.parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = jsonsafe.parse(form["payload"][0])  # the one parser of every door
        if payload.get("type") != "block_actions":
            raise BadInteraction(f"not a button click ({one_line(payload.get('type'))[:40]})")
        action = payload["actions"][0]
        value = jsonsafe.parse(action["value"])
        decision = action["action_id"]
        if decision not in ACTIONS:
            raise BadInteraction(f"not an Airlock button ({one_line(decision)[:40]})")
        approval_id = int(value["approval"])
        if not 0 < approval_id <= access.MAX_ID:
            raise BadInteraction("no such approval")
        # Text PostgreSQL can store, cleaned as arguments are (a NUL lost the click's row).
        return Click(
            member_id=sanitize.clean(str(payload["user"]["id"])[:40]),
            action_ts=sanitize.clean(str(action.get("action_ts") or payload.get("trigger_id") or "")[:40]),
            decision=decision,
            approval_id=approval_id,
            args_hash=sanitize.clean(str(value["args_hash"])[:64]),
            response_url=sanitize.clean(str(payload.get("response_url") or "")[:2000]),
            sent=_sent(value, payload),
            member_name=sanitize.clean(str(payload["user"].get("username") or payload["user"].get("name") or "")[:80]),
        )
    except BadInteraction:
        raise
    except (UnicodeDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BadInteraction(f"not a Slack interaction payload ({type(exc).__name__})") from None


def _sent(value: dict[str, Any], payload: dict[str, Any]) -> float | None:
    """When the clicked message was made: the time our button carries, else Slack's
    `container.message_ts` (both inside the signed body)."""
    container = payload.get("container") if isinstance(payload.get("container"), dict) else {}
    for raw in (value.get("sent"), container.get("message_ts")):
        try:
            sent = float(raw)
        except (TypeError, ValueError):
            continue
        if math.isfinite(sent) and sent > 0:
            return sent
    return None


def record(click: Click) -> SlackAction | None:
    """The click's log row, or None when Slack already delivered this click (a retry)."""
    try:
        with transaction.atomic():
            return SlackAction.objects.create(
                member_id=click.member_id,
                action_ts=click.action_ts,
                decision=click.decision,
                approval_id=click.approval_id if Approval.objects.filter(pk=click.approval_id).exists() else None,
                response_url=click.response_url,
                outcome="received",
            )
    except IntegrityError:
        # The first delivery of this click made the row: it decides (or decided).
        return None


# -- the decision, in a thread the request waits for a bounded time ------------------

_working: set[threading.Thread] = set()
_working_lock = threading.Lock()


def handle(click: Click, *, retry: str = "") -> threading.Thread:
    """Record and decide `click` in a thread (its own database connection; the request's
    thread touches none), which the caller waits for at most
    AIRLOCK_SLACK_ANSWER_SECONDS. The thread posts the outcome to the response_url.
    A click Slack delivered before (`retry`: its X-Slack-Retry-Num) finds its row and
    decides nothing."""

    def work() -> None:
        try:
            row = record(click)
            if row is None:
                log.info(
                    "slack retry %s of member=%s action_ts=%s: already received, nothing decided",
                    retry or "?",
                    click.member_id,
                    click.action_ts,
                )
                return
            decide_click(click, row)
        except Exception:  # noqa: BLE001 - a click must never take the web process down
            log.exception("slack click member=%s approval=%s failed", click.member_id, click.approval_id)
        finally:
            connection.close()
            with _working_lock:
                _working.discard(thread)

    thread = threading.Thread(target=work, name=f"slack-click-{click.approval_id}", daemon=True)
    with _working_lock:
        _working.add(thread)
    thread.start()
    return thread


def wait_idle(timeout: float = 60.0) -> None:
    """Wait for every click this process is deciding (tests; a graceful shutdown)."""
    with _working_lock:
        threads = list(_working)
    for t in threads:
        t.join(timeout)


def decide_click(click: Click, row: SlackAction) -> str:
    """Decide as the linked reviewer, log the outcome on the click's row and tell Slack."""
    close_old_connections()
    pref = linked(click.member_id)
    user = pref.user if pref is not None else None
    reply: dict[str, Any]
    if user is None:
        outcome = "refused: unlinked Slack user"
        # Only the clicker sees an ephemeral reply: the link in it is the proof that
        # whoever opens it in Airlock controls this member id.
        reply = ephemeral(
            "Your Slack account is not linked to an Airlock reviewer, so this click decided nothing. "
            f"To link it to your Airlock account, open {link_url(click.member_id, click.member_name)} within "
            f"{LINK_MAX_AGE // 60} minutes (it is meant for you alone)."
        )
    elif changed_since(pref, click, Approval.objects.filter(pk=click.approval_id).values_list("created_at", flat=True).first()):
        outcome = "refused: link changed"
        reply = ephemeral(
            "This Slack account was linked to an Airlock account after this message was sent, so this click "
            "decided nothing. Open the call in Airlock to decide it."
        )
    else:
        outcome, reply = _decide_as(user, click)
    SlackAction.objects.filter(pk=row.pk).update(
        user=user, outcome=outcome[:200], updated_message_at=timezone.now() if reply.get("replace_original") else None
    )
    log.info("slack click member=%s approval=%s %s: %s", click.member_id, click.approval_id, click.decision, outcome)
    respond(click.response_url, reply)
    return outcome


def _decide_as(user: Any, click: Click) -> tuple[str, dict[str, Any]]:
    approval = Approval.objects.select_related("run").filter(pk=click.approval_id).first()
    if approval is None or not access.may_decide(user, approval):
        return "refused: may not decide", ephemeral(
            f"{_e(user.get_username())} may not decide this call (reviewers decide): nothing was recorded."
        )
    try:
        result = approval_decide(
            approval_id=click.approval_id, user=user, decision=click.decision, args_hash=click.args_hash, via="slack",
            by_reviewer=True,
        )
    except ActionError as exc:
        if exc.code == "call_changed":
            approval = Approval.objects.get(pk=click.approval_id)
            return "refused: call changed", replace(
                approval,
                "The call changed since this message was sent (its arguments were edited): this click decided "
                "nothing. Review the call as it stands",
            )
        if exc.code == "separation_of_duties":
            return "refused: separation of duties", ephemeral(
                "You launched this run and its policy separates duties: another reviewer must decide. "
                "Nothing was recorded."
            )
        detail = exc.detail.get("message") if isinstance(exc.detail, dict) else exc.detail
        return f"refused: {exc.code}", ephemeral(f"Nothing was recorded: {_e(detail)}")
    approval = result.approval
    if result.outcome == "decided":
        return "decided", replace(approval, "")
    if result.outcome == "voted":
        votes = sum(1 for v in approval.current_votes() if v.decision == "approve")
        return "voted", ephemeral(f"Your vote is recorded: {votes} of {approval.required} approvals so far.")
    if result.outcome == "already_voted":
        return "already voted", ephemeral("You had already voted on this call: nothing changed.")
    # Late: decided elsewhere first, expired, or the run ended. The message shows it now.
    return "late", replace(approval, "")


def linked(member_id: str) -> NotificationPreference | None:
    """The link of an active user to `member_id`, with its user, or None."""
    return (
        NotificationPreference.objects.select_related("user")
        .filter(slack_member_id=member_id, user__is_active=True)
        .exclude(slack_member_id="")
        .first()
    )


def linked_user(member_id: str) -> Any:
    pref = linked(member_id)
    return pref.user if pref is not None else None


def changed_since(pref: NotificationPreference, click: Click, approval_created: dt.datetime | None) -> bool:
    """Whether the member's link was made after the clicked message was: its clicks
    belonged to someone else (or to no one) when the message went out. Without the
    message's time, the call's creation stands in (the message came after it)."""
    if pref.slack_linked_at is None:
        return False  # linked before links were timed: before any message of today's
    if click.sent is not None:
        return pref.slack_linked_at.timestamp() > click.sent
    return approval_created is None or pref.slack_linked_at > approval_created


def link(username: str, member_id: str) -> Any:
    """An admin's link (`manage.py link_slack`): `member_id` to `username`, moved from
    whoever held it, who is told."""
    member_id = valid_member_id(member_id)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValueError(f"no user {username!r}")
    link_move(user=user, member_id=member_id, how="by an administrator (manage.py link_slack)")
    return user


def valid_member_id(member_id: str) -> str:
    member_id = member_id.strip()
    if not member_id or len(member_id) > 40 or not member_id.isalnum():
        raise ValueError(f"{member_id!r} is not a Slack member id (such as U012ABCDEF)")
    return member_id


def link_move(*, user: Any, member_id: str, how: str) -> Any:
    """Link `member_id` to `user` (a member id names one user only): the one place a
    link is made, by proof or by an admin, never by someone merely typing an id.
    Returns the previous owner (told by email after the commit), or None.

    Under the rows' locks: two moves of one member id queue, and the second sees the
    first's owner as the previous one."""
    now = timezone.now()
    with transaction.atomic():
        held = list(
            NotificationPreference.objects.select_for_update().select_related("user")
            .filter(slack_member_id=member_id).exclude(user=user)
        )
        NotificationPreference.objects.filter(pk__in=[p.pk for p in held]).update(slack_member_id="", slack_linked_at=now)
        mine, _ = NotificationPreference.objects.select_for_update().get_or_create(user=user)
        if mine.slack_member_id != member_id:
            mine.slack_member_id, mine.slack_linked_at = member_id, now
            mine.save(update_fields=["slack_member_id", "slack_linked_at"])
        previous = held[0].user if held else None
        if previous is not None:
            log.warning(
                "slack member %s moved from user=%s to user=%s %s", member_id, previous.pk, user.pk, how
            )
            transaction.on_commit(lambda: _tell_previous(previous, user, member_id, how))
    return previous


def _tell_previous(previous: Any, user: Any, member_id: str, how: str) -> None:
    """Email the previous owner of a Slack link that it moved (best effort: logged)."""
    if not previous.email:
        log.warning("slack member %s: user=%s has no email to be told of the move", member_id, previous.pk)
        return
    text = (
        f"Your Slack member id {member_id} is no longer linked to your Airlock account {previous.get_username()}: "
        f"it was linked to {user.get_username()} {how} on {timezone.now():%Y-%m-%d %H:%M} UTC.\n\n"
        "Your clicks in Slack no longer decide as you. If you did not expect this, tell an administrator; "
        f"your settings: {settings.AIRLOCK_BASE_URL}{reverse('notifications')}\n"
    )
    try:
        send_mail("Airlock: your Slack link moved", text, settings.DEFAULT_FROM_EMAIL, [previous.email])
    except Exception:  # noqa: BLE001 - the move stands; the log says who was not told
        log.exception("slack member %s: telling user=%s of the move failed", member_id, previous.pk)


# -- linking with proof: a signed click of the member, then its ephemeral link ----------

LINK_SALT = "airlock.slack-link"
LINK_MAX_AGE = 30 * 60


def _link_state(member_id: str) -> str:
    """The member's link as it stands: a token made for one state is spent once it changes."""
    pref = NotificationPreference.objects.filter(slack_member_id=member_id).first()
    if pref is None:
        return ""
    return f"{pref.user_id}@{pref.slack_linked_at.timestamp() if pref.slack_linked_at else 0}"


def link_token(member_id: str, name: str = "") -> str:
    """A token proving that whoever holds it was shown it by Slack as `member_id` (it
    goes only into an ephemeral reply to that member's signed click); `name`, the Slack
    username the click carried, is shown on the confirmation page."""
    return signing.dumps({"m": member_id, "n": name, "s": _link_state(member_id)}, salt=LINK_SALT, compress=True)


def link_url(member_id: str, name: str = "") -> str:
    return settings.AIRLOCK_BASE_URL + reverse("slack_link", args=[link_token(member_id, name)])


class LinkInvalid(Exception):
    pass


def link_member(token: str) -> tuple[str, str]:
    """The member id a token proves and the Slack username it was made for, or
    LinkInvalid (forged, expired, or spent: the member's link changed since it was made)."""
    try:
        data = signing.loads(token, salt=LINK_SALT, max_age=LINK_MAX_AGE)
    except signing.SignatureExpired:
        raise LinkInvalid("This link expired: click a button in Slack again for a new one.") from None
    except signing.BadSignature:
        raise LinkInvalid("This link is not valid.") from None
    member_id = str(data.get("m", ""))
    if data.get("s") != _link_state(member_id):
        raise LinkInvalid("This link was already used (the Slack account's link changed since).")
    return member_id, str(data.get("n", ""))


# -- what Slack is sent ---------------------------------------------------------------


_e = slack_escape


def ephemeral(text: str) -> dict[str, Any]:
    """Shown to the clicker only; the message stays as it was."""
    return {"response_type": "ephemeral", "replace_original": False, "text": text}


def decided_text(approval: Approval) -> str:
    who = approval.decided_by.get_username() if approval.decided_by else ""
    via = f" via {approval.via}" if approval.via else ""
    if approval.status == decisions.PENDING:
        return f"`{_e(approval.tool)}` on run {approval.run_id} waits for review"
    if who:
        return f"`{_e(approval.tool)}` on run {approval.run_id} was {_e(approval.status)} by {_e(who)}{via}"
    return f"`{_e(approval.tool)}` on run {approval.run_id} is {_e(approval.status)}"


def replace(approval: Approval, why: str) -> dict[str, Any]:
    """The message rewritten to say what became of the call; no buttons left."""
    url = settings.AIRLOCK_BASE_URL + reverse("reviews:approval", args=[approval.pk])
    text = f"{why}: <{url}|open the call>" if why else f"{decided_text(approval)}. <{url}|Open the call>"
    return {
        "replace_original": True,
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    }


def respond(response_url: str, message: dict[str, Any]) -> bool:
    """POST `message` to a click's response_url (the same outbound guard as webhooks:
    public addresses, or a host in AIRLOCK_WEBHOOK_ALLOWED_HOSTS). One attempt, logged."""
    if not response_url:
        return False
    try:
        code = post(
            response_url,
            json.dumps(message, ensure_ascii=False).encode(),
            {"Content-Type": "application/json", "User-Agent": "Airlock-slack/1"},
            Deadline(settings.AIRLOCK_WEBHOOK_TIMEOUT),
        )
    except (UrlRefused, httpx.HTTPError) as exc:
        log.warning("slack response_url not updated (%s: %s)", type(exc).__name__, exc)
        return False
    if not 200 <= code < 300:
        log.warning("slack response_url answered HTTP %s", code)
    return 200 <= code < 300


def update_decided(*, limit: int = 100) -> int:
    """Rewrite the Slack messages of calls decided (or expired) elsewhere, once each,
    through the response_url of a click on them that is still valid. Returns how many."""
    fresh = timezone.now() - dt.timedelta(seconds=RESPONSE_URL_LIFETIME_SECONDS)
    rows = list(
        SlackAction.objects.filter(updated_message_at__isnull=True, created_at__gte=fresh)
        .exclude(response_url="")
        .exclude(approval__status=decisions.PENDING)
        .exclude(approval=None)
        .order_by("-pk")[:limit]
    )
    done = 0
    seen: set[int] = set()
    for row in rows:
        if row.approval_id in seen:
            continue
        seen.add(row.approval_id)  # type: ignore[arg-type]
        # Take every row of this approval: another dispatcher that took them first sends.
        taken = SlackAction.objects.filter(approval_id=row.approval_id, updated_message_at__isnull=True).update(
            updated_message_at=timezone.now()
        )
        if not taken:
            continue
        approval = Approval.objects.select_related("decided_by").get(pk=row.approval_id)
        done += respond(row.response_url, replace(approval, ""))
    return done
