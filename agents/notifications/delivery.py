"""Delivering the outbox: signed webhooks (Standard Webhooks), Slack, the reviewers' digest.

Work comes from `OutboxEvent` rows the store wrote with their transitions. Every step
is a conditional update or a skip-locked read, so any number of workers can dispatch
at once; a worker that dies leaves rows that the next dispatch picks up:

- fan-out: render an event's `data` once, make one `Delivery` per subscribed webhook;
- delivery: lease a due delivery, record the attempt, POST outside any transaction,
  record the outcome; failures wait with exponential back-off and jitter, then `dead`;
- digest: pending calls go to reviewers as one email once the oldest is a window old.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import random
import secrets
import time
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import F, QuerySet, prefetch_related_objects
from django.urls import reverse
from django.utils import timezone

from agents import access
from agents.engine.text import one_line
from agents.models import (
    Approval,
    Delivery,
    DeliveryAttempt,
    DigestEntry,
    NotificationPreference,
    OutboxEvent,
    Run,
    Webhook,
)
from agents.notifications import events as outbox
from agents.notifications.links import link_create, link_url, needs_step_up
from agents.tools.http import Deadline, UrlRefused, client, public_addresses

log = logging.getLogger("airlock.notify")

FAN_OUT_BATCH = 200
DELIVERY_BATCH = 100
DIGEST_MAX = 500
DISPATCH_SECONDS = 30.0  # work per task; the next wake-up or beat goes on
SLACK_TEXT_MAX = 2900  # Slack refuses a section's text over 3000 characters


# -- secrets and signatures (https://www.standardwebhooks.com/) -------------------------


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` keyed by the secret's bytes."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


# -- what is sent ---------------------------------------------------------------------


def approval_url(approval_id: int) -> str:
    """The approval's own page (any status): the queue shows only its first cards."""
    return settings.AIRLOCK_BASE_URL + reverse("reviews:approval", args=[approval_id])


def link(event: OutboxEvent) -> str:
    """The approval's own page, or the run's timeline."""
    if event.approval_id is not None:
        return approval_url(event.approval_id)
    return settings.AIRLOCK_BASE_URL + reverse("run_detail", args=[event.run_id])


def render(event: OutboxEvent) -> dict[str, Any]:
    """The approval or run exactly as the JSON API returns it (`to_dict()` through the
    same JSON encoder), plus `url`."""
    subject: Any = (
        Approval.objects.select_related("decided_by").get(pk=event.approval_id)
        if event.approval_id is not None
        else Run.objects.select_related("profile").get(pk=event.run_id)
    )
    data = json.loads(json.dumps(subject.to_dict(), cls=DjangoJSONEncoder))
    data["url"] = link(event)
    return data


def body(event: OutboxEvent, webhook: Webhook) -> bytes:
    """The same bytes on every attempt: built from the frozen `data`."""
    if webhook.format == "slack":
        payload: dict[str, Any] = slack_message(event.type, event.data or {}, sent=event.created_at.timestamp())
    else:
        payload = {"type": event.type, "timestamp": event.created_at, "data": event.data}
    return json.dumps(payload, cls=DjangoJSONEncoder, ensure_ascii=False).encode()


def slack_escape(text: Any) -> str:
    # Slack's mrkdwn treats these three as control characters; the rest stays inert text.
    # One line: a line break would end the `>` quote and let the text pose as ours.
    return one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(event_type: str, data: dict[str, Any], *, sent: float | None = None) -> dict[str, Any]:
    """Slack's incoming-webhook body: `text` (notifications, fallback) and blocks.
    `sent`: the event's time, which the buttons carry (a click from a member linked
    after it decides nothing)."""
    e = slack_escape
    url = data.get("url", "")
    if event_type.startswith("approval."):
        what = {
            "approval.pending": "waits for review",
            "approval.decided": f"was {e(data.get('status'))} by {e(data.get('decided_by') or 'the system')}",
            "approval.expired": "expired without a decision",
            "approval.expiring": "expires soon",
            "approval.escalated": f"still waits for review: escalated to {e(data.get('escalated_to') or 'the backup group')}",
        }.get(event_type, event_type)
        text = f"{e(data.get('tool'))} on run {data.get('run')} {what}"
        detail = f"*`{e(data.get('tool'))}`* on run {data.get('run')} {what}\n>{e(data.get('reason'))}"
        action = "Open the call"
    else:
        state = data.get("state", event_type.removeprefix("run."))
        text = f"Run {data.get('id')} ({e(data.get('agent'))}) {e(state)}"
        outcome = data.get("answer") if state == "done" else data.get("error")
        detail = f"*Run {data.get('id')}* ({e(data.get('agent'))}) {e(state)}: {e(data.get('task'))}"
        if outcome:
            detail += f"\n>{e(outcome)}"
        action = "Open the timeline"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": detail[:SLACK_TEXT_MAX]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"<{url}|{action}>"}},
    ]
    # Buttons where someone new may answer: a call asked, or handed to the backup group.
    if event_type in BUTTON_EVENTS and data.get("id") and data.get("status", "pending") == "pending":
        blocks.append(slack_buttons(data, sent=sent))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"Airlock · {event_type}"}]})
    return {"text": f"{text}: {url}", "blocks": blocks}


BUTTON_EVENTS = ("approval.pending", "approval.escalated")


def slack_buttons(data: dict[str, Any], *, sent: float | None = None) -> dict[str, Any]:
    """Approve and Reject on an `approval.pending` or `approval.escalated` message
    (answered by agents.notifications.slack): each carries the approval and the
    args_hash of the call the message shows, so a click after an edit is refused, and
    when the message was made (`sent`, the event's time: the same bytes on every attempt)."""
    fields: dict[str, Any] = {"approval": data.get("id"), "args_hash": data.get("args_hash", "")}
    if sent is not None:
        fields["sent"] = round(sent, 3)
    value = json.dumps(fields)
    button = {"type": "button", "value": value}
    return {
        "type": "actions",
        "block_id": f"airlock_approval_{data.get('id')}",
        "elements": [
            {**button, "action_id": "approve", "style": "primary", "text": {"type": "plain_text", "text": "Approve"}},
            {**button, "action_id": "reject", "style": "danger", "text": {"type": "plain_text", "text": "Reject"}},
        ],
    }


# -- the outgoing request -------------------------------------------------------------


def host_allowed(host: str) -> bool:
    return host.lower().rstrip(".") in settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS


def target(url: str) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """Where to connect, the Host header and the TLS name: a listed host as it is;
    any other only at a public address, pinned to the one we checked (a second DNS
    lookup could answer differently). Raises UrlRefused."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UrlRefused("only http and https URLs with a host are delivered to")
    if host_allowed(parsed.host):
        return parsed, {}, {}
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        address = public_addresses(parsed.host, port)[0]
    except UrlRefused as exc:
        raise UrlRefused(f"{exc} (webhooks likewise; AIRLOCK_WEBHOOK_ALLOWED_HOSTS lets a host through)") from None
    host_header = parsed.host if parsed.port is None else f"{parsed.host}:{parsed.port}"
    extensions = {"sni_hostname": parsed.host} if parsed.scheme == "https" else {}
    return parsed.copy_with(host=address), {"Host": host_header}, extensions


def post(url: str, content: bytes, headers: dict[str, str], deadline: Deadline | None = None) -> int:
    """POST and return the status code; raises UrlRefused or httpx.HTTPError.

    The whole exchange ends by `deadline` (default: AIRLOCK_WEBHOOK_TIMEOUT from now),
    however slowly the receiver answers; its body is never read (the status is the
    answer), so a receiver cannot make us read, or hold, a large one."""
    deadline = deadline or Deadline(settings.AIRLOCK_WEBHOOK_TIMEOUT)
    where, extra, extensions = target(url)
    # No redirects (a 3xx is a failure: a redirect could point inside), no proxies.
    with (
        client(deadline) as session,
        session.stream("POST", where, content=content, headers={**headers, **extra}, extensions=extensions) as response,
    ):
        return response.status_code


# -- dispatch -------------------------------------------------------------------------


def dispatch() -> dict[str, int]:
    """One bounded round: fan out new events, deliver what is due, send a due digest."""
    started = time.monotonic()
    fanned = fan_out()
    delivered, failed = deliver_due(budget=DISPATCH_SECONDS - (time.monotonic() - started))
    emailed = send_call_emails() + send_digest()
    if fanned or delivered or failed or emailed:
        log.info("notify fanned_out=%s delivered=%s failed=%s emailed=%s", fanned, delivered, failed, emailed)
    return {"fanned_out": fanned, "delivered": delivered, "failed": failed, "emailed": emailed}


def fan_out(*, now: dt.datetime | None = None) -> int:
    """Render new events and make their deliveries, in one transaction per batch.

    Rows another dispatcher has locked are skipped (it fans them out); the unique
    (event, webhook) pair makes a repeat harmless anyway.
    """
    now = now or timezone.now()
    with transaction.atomic():
        events = list(
            OutboxEvent.objects.select_for_update(skip_locked=True)
            .filter(dispatched_at__isnull=True)
            .order_by("pk")[:FAN_OUT_BATCH]
        )
        if not events:
            return 0
        hooks = list(Webhook.objects.filter(active=True))
        # A project's webhooks receive its runs' events only (Webhook.wants): one query
        # names the batch's projects.
        projects = dict(
            Run.objects.filter(pk__in={e.run_id for e in events}).values_list("pk", "profile__project_id")
        ) if hooks else {}
        deliveries: list[Delivery] = []
        for event in events:
            wanted = [h for h in hooks if h.wants(event.type, projects.get(event.run_id))]
            if wanted:  # rendering costs queries; an event nobody subscribed to needs none
                event.data = render(event)
            event.dispatched_at = now
            deliveries += [Delivery(event=event, webhook=h, next_attempt_at=now) for h in wanted]
        OutboxEvent.objects.bulk_update(events, ["data", "dispatched_at"])
        Delivery.objects.bulk_create(deliveries, ignore_conflicts=True)
    return len(events)


def deliver_due(*, budget: float = DISPATCH_SECONDS) -> tuple[int, int]:
    """Attempt the due deliveries (oldest first) until the batch or the time runs out."""
    started = time.monotonic()
    due = list(
        Delivery.objects.filter(status="pending", next_attempt_at__lte=timezone.now(), webhook__active=True)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:DELIVERY_BATCH]
    )
    delivered = failed = 0
    for pk in due:
        if time.monotonic() - started >= budget:
            break
        outcome = attempt(pk)
        delivered += outcome is True
        failed += outcome is False
    return delivered, failed


def attempt(delivery_id: int) -> bool | None:
    """One attempt: True delivered, False failed, None not ours to make.

    1. Lease: a conditional update counts the attempt and pushes `next_attempt_at` past
       the request's timeout; the attempt row is written in the same transaction.
    2. POST outside any transaction, signed with this attempt's timestamp.
    3. Record the outcome, only if the lease is still ours.
    """
    # The request's overall deadline starts with the lease, so everything up to the
    # POST (rendering, DNS) counts too, and no byte is sent once it has passed. The
    # lease lasts twice as long plus 5 s (clock skew between workers, recording the
    # outcome): another worker can take the delivery only after this attempt can
    # no longer be sending, so a slow receiver cannot get it twice at once.
    deadline = Deadline(settings.AIRLOCK_WEBHOOK_TIMEOUT)
    now = timezone.now()
    lease_until = now + dt.timedelta(seconds=lease_seconds())
    with transaction.atomic():
        leased = Delivery.objects.filter(pk=delivery_id, status="pending", next_attempt_at__lte=now).update(
            attempts=F("attempts") + 1, next_attempt_at=lease_until
        )
        if leased != 1:
            # Another worker took it first (it sends), or it was delivered meanwhile.
            return None
        delivery = Delivery.objects.select_related("event", "webhook").get(pk=delivery_id)
        # Numbered over the delivery's whole life: a resend starts `attempts` over, not this.
        number = DeliveryAttempt.objects.filter(delivery=delivery).count() + 1
        row = DeliveryAttempt.objects.create(delivery=delivery, number=number, started_at=now)
    event, hook = delivery.event, delivery.webhook
    content = body(event, hook)
    stamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Airlock-webhooks/1",
        "webhook-id": event.msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign(hook.secret, event.msg_id, stamp, content),
    }
    started = time.monotonic()
    code: int | None = None
    error = ""
    try:
        code = post(hook.url, content, headers, deadline)
        if not 200 <= code < 300:
            error = f"HTTP {code}"
    except UrlRefused as exc:
        error = f"refused: {exc}"
    except httpx.HTTPError as exc:
        # httpx's messages name the failure, not the URL (a Slack URL is a secret).
        error = f"{type(exc).__name__}: {exc}"[:500]
    ok = not error
    finished = timezone.now()
    fields: dict[str, Any] = {"last_status_code": code, "last_error": error}
    if ok:
        fields.update(status="delivered", delivered_at=finished, next_attempt_at=None)
    elif delivery.attempts >= settings.AIRLOCK_WEBHOOK_MAX_ATTEMPTS:
        fields.update(status="dead", next_attempt_at=None)
    else:
        fields["next_attempt_at"] = finished + dt.timedelta(seconds=backoff(delivery.attempts))
    with transaction.atomic():
        DeliveryAttempt.objects.filter(pk=row.pk).update(
            finished_at=finished, status_code=code, error=error, duration_ms=int((time.monotonic() - started) * 1000)
        )
        # Our attempt outlived its lease and another worker took the delivery: its outcome stands.
        Delivery.objects.filter(pk=delivery_id, attempts=delivery.attempts, status="pending").update(**fields)
    log.info(
        "webhook delivery=%s webhook=%s event=%s attempt=%s %s",
        delivery_id,
        hook.pk,
        event.msg_id,
        number,
        "delivered" if ok else error,
    )
    return ok


def lease_seconds() -> float:
    """How long a delivery being attempted is leased: past the request's overall deadline
    (AIRLOCK_WEBHOOK_TIMEOUT from the lease), with room to record the outcome."""
    return 2 * settings.AIRLOCK_WEBHOOK_TIMEOUT + 5


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: exponential, capped,
    with +-20% jitter so receivers coming back are not hit by every sender at once."""
    base = settings.AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS * 4 ** (attempts - 1)
    return min(settings.AIRLOCK_WEBHOOK_RETRY_MAX_SECONDS, base) * random.uniform(0.8, 1.2)


def resend(deliveries: QuerySet[Delivery]) -> int:
    """Give dead deliveries a new round of attempts, same webhook-id and body."""
    count = deliveries.filter(status="dead").update(
        status="pending", attempts=0, next_attempt_at=timezone.now(), last_error=""
    )
    if count:
        outbox.wake_after_commit()
    return count


# -- the reviewers' digest ------------------------------------------------------------


def digest_recipients() -> list[Any]:
    """Reviewers of any profile (backup groups too: an escalated call reaches them) with
    an email address who did not turn the digest off; `digest_for` picks their calls."""
    return list(
        access.reviewers().exclude(email="").exclude(notification_preference__email_digest=False).order_by("pk")
    )


def digest_for(user: Any) -> list[Approval]:
    """What `user`'s next digest holds: every pending call they may decide (so not the
    calls of a run they launched whose duties are separated, nor those waiting for
    other reviewers' votes after theirs), not yet mailed to them, oldest first. At most
    DIGEST_MAX; the rest follow in the next one."""
    calls = list(
        # The calls they may decide (their projects', their groups'), nothing of the others'.
        access.reviewable_approvals(user)
        .pending()
        .exclude(digest_entries__user=user)
        .annotate(launcher=F("run__created_by_id"), run_deadline=F("run__deadline"))
        .order_by("created_at", "pk")[:DIGEST_MAX]
    )
    own = {a.run_id for a in calls if a.launcher == user.pk}  # type: ignore[attr-defined]
    if own:
        runs = Run.objects.filter(pk__in=own).select_related("profile").defer("script")
        separated = {r.pk for r in runs if access.duties_separated(user, r)}
        calls = [a for a in calls if a.run_id not in separated]
    voting = [a for a in calls if a.may_have_votes]  # several votes needed: read them
    if voting:
        prefetch_related_objects(voting, "votes")
        voted = {a.pk for a in voting if any(v.by_id == user.pk for v in a.current_votes())}
        calls = [a for a in calls if a.pk not in voted]
    return calls


def _call_lines(a: Approval, user: Any) -> list[str]:
    # One line each: a reason or a tool name with a line break forged entries. The link
    # is this reviewer's alone, for this call as it stands (agents.notifications.links),
    # and lives no longer than the call can still be decided.
    closes = a.closes_at(getattr(a, "run_deadline", None))
    token = link_create(user=user, approval=a, until=closes)
    login = " (asks you to log in first)" if needs_step_up(a) else ""
    why = "the call expires then" if a.expires_at is not None and a.expires_at <= closes else "its run's deadline"
    return [
        f"- {one_line(a.tool)} (run {a.run_id}, {a.risk}): {one_line(a.reason)}",
        f"  Decide by {closes.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC ({why}).",
        f"  Approve or reject{login}: {link_url(token)}",
        f"  The call in Airlock: {approval_url(a.pk)}",
        "",
    ]


def _footer() -> str:
    return (
        "Each link is yours alone, works once, for the call as shown, until its call's decide-by time and at "
        f"most {settings.AIRLOCK_EMAIL_LINK_HOURS:g} hours; opening it decides nothing.\n"
        f"You get this as a reviewer. Turn these emails off: {settings.AIRLOCK_BASE_URL}{reverse('notifications')}"
    )


def _digest_text(calls: list[Approval], user: Any) -> tuple[str, str]:
    n = len(calls)
    subject = f"Airlock: {n} tool call{'s' if n != 1 else ''} waiting for review"
    lines = [f"{n} tool call{' waits' if n == 1 else 's wait'} for a reviewer:", ""]
    for a in calls:
        lines += _call_lines(a, user)
    lines.append(_footer())
    return subject, "\n".join(lines)


def _call_text(a: Approval, user: Any) -> tuple[str, str]:
    subject = f"Airlock: {one_line(a.tool)[:80]} on run {a.run_id} waits for review"
    return subject, "\n".join(["A tool call waits for a reviewer:", "", *_call_lines(a, user), _footer()])


def send_call_emails(*, now: dt.datetime | None = None) -> int:
    """Email each call, as it starts waiting, to the reviewers who asked for one email per
    call (`email_each_call`): what `digest_for` would hold, one email each, recorded as
    DigestEntry rows so no digest repeats them. Same transaction rules as send_digest."""
    now = now or timezone.now()
    sent = 0
    users = (
        access.reviewers().exclude(email="").filter(notification_preference__email_each_call=True).order_by("pk")
    )
    for user in users:
        try:
            with transaction.atomic():
                mine = NotificationPreference.objects.select_for_update(skip_locked=True).filter(user=user).first()
                if mine is None or not mine.email_each_call:
                    continue
                calls = digest_for(user)
                if not calls:
                    continue
                mails = [
                    EmailMessage(*_call_text(a, user), settings.DEFAULT_FROM_EMAIL, [user.email]) for a in calls
                ]
                with get_connection() as connection:
                    connection.send_messages(mails)
                DigestEntry.objects.bulk_create(
                    [DigestEntry(user=user, approval=a, mailed_at=now) for a in calls], ignore_conflicts=True
                )
                sent += len(mails)
        except Exception:  # noqa: BLE001 - one failing address must not hold up the others
            log.exception("call emails to user=%s failed; the next round tries again", user.pk)
    return sent


def send_digest(*, now: dt.datetime | None = None) -> int:
    """Email each reviewer the calls waiting for them (`digest_for`) once the oldest of
    those has waited AIRLOCK_EMAIL_DIGEST_SECONDS; returns the number of emails sent.

    Per reviewer, in one transaction: lock their preference row (another dispatcher
    holding it is mailing them: skip), read what they were not told, send, record it
    (DigestEntry). A failed send rolls back and the next round tries again (at least
    once); calls decided meanwhile are left out.
    """
    now = now or timezone.now()
    due = now - dt.timedelta(seconds=settings.AIRLOCK_EMAIL_DIGEST_SECONDS)
    # The common answer, in one indexed query: nothing has waited a window.
    if not Approval.objects.pending().filter(created_at__lte=due).exists():
        return 0
    sent = 0
    for user in digest_recipients():
        NotificationPreference.objects.get_or_create(user=user)
        try:
            with transaction.atomic():
                mine = NotificationPreference.objects.select_for_update(skip_locked=True).filter(user=user).first()
                if mine is None or not mine.email_digest:
                    # Another dispatcher holds it (it sends), or they turned it off just now.
                    continue
                calls = digest_for(user)
                if not calls or calls[0].created_at > due:
                    continue
                subject, text = _digest_text(calls, user)
                with get_connection() as connection:
                    connection.send_messages([EmailMessage(subject, text, settings.DEFAULT_FROM_EMAIL, [user.email])])
                DigestEntry.objects.bulk_create(
                    [DigestEntry(user=user, approval=a, mailed_at=now) for a in calls], ignore_conflicts=True
                )
                sent += 1
        except Exception:  # noqa: BLE001 - one failing address must not hold up the others
            log.exception("digest to user=%s failed; the next round tries again", user.pk)
    return sent
