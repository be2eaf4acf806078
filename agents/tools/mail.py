"""The `send_email` tool.

| tool | risk | returns | retry safety | why |
|---|---|---|---|---|
| send_email | write | internal | safe | one email per idempotency key (a ledger row per key) |
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction

from agents.engine.registry import ToolContext, ToolSpec
from agents.models import LedgerEntry


def send_email(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """One email per idempotency key.

    The ledger row and the send share one database transaction: if sending raises, the
    row is rolled back and a retry sends; a second call with the same key finds the row
    (a concurrent one waits on the unique index until the first commits) and sends
    nothing. A crash after the mail server accepted the message but before the commit
    sends it again on resume: at least once, with the same Message-ID so a mail system
    can still drop the duplicate.
    """
    recipients = args["to"] if isinstance(args["to"], list) else [args["to"]]
    message_id = f"<{ctx.idempotency_key}@airlock>"
    with transaction.atomic():
        _, created = LedgerEntry.objects.get_or_create(
            idempotency_key=ctx.idempotency_key,
            defaults={"run_id": int(ctx.run_id),
                      "entry": {"kind": "email", "to": recipients, "subject": args["subject"]}},
        )
        if not created:
            return {"sent": False, "duplicate": True, "message_id": message_id,
                    "detail": "already sent with this idempotency key"}
        EmailMessage(
            subject=args["subject"], body=args["body"], from_email=settings.DEFAULT_FROM_EMAIL, to=recipients,
            headers={"Message-ID": message_id, "X-Airlock-Run": ctx.run_id},
        ).send()
    return {"sent": True, "to": recipients, "message_id": message_id}


EMAIL = {"type": "string", "format": "email", "maxLength": 254}
TOOLS = [
    ToolSpec(
        "send_email", "Sends one email to one or more recipients.",
        {"type": "object",
         "properties": {
             "to": {"anyOf": [EMAIL, {"type": "array", "items": EMAIL, "minItems": 1, "maxItems": 50}]},
             "subject": {"type": "string", "minLength": 1, "maxLength": 200},
             "body": {"type": "string", "minLength": 1, "maxLength": 20000}},
         "required": ["to", "subject", "body"], "additionalProperties": False},
        "write", "internal", "safe", send_email, timeout=30,
    ),
]
