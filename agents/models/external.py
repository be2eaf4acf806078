"""Calls proposed by external agents through the decision API (agents/actions/external.py)."""

from __future__ import annotations

from django.db import models


class ClientCall(models.Model):
    """One call an external agent proposed, under the key the API answered with.

    The engine's rows say what became of it (the journal's `ToolCall`, the `Approval`,
    both found by the run and `call_id`); this row is how a client's key finds them
    again, and records the verdict of a call that got no other row (a denial). Written
    in the transaction of the transition that proposed the call.
    """

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="client_calls", db_index=False)
    key = models.CharField(max_length=64, help_text="the idempotency key of the call as proposed")
    call_id = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=32, help_text="tool + canonical args: an identical retry's match")
    tool = models.CharField(max_length=100)
    args = models.JSONField(null=True)
    client = models.BooleanField(default=False, help_text="a client tool: the client runs it and reports")
    verdict = models.CharField(max_length=10)
    reason = models.TextField(blank=True)
    rule = models.JSONField(null=True, blank=True)
    # The gateway answered this call's outcome to its stream (docs/gateway.md, "Held
    # calls"): the stream's next identical call is a new intent, policed anew.
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["run", "fingerprint"], name="clientcall_run_fingerprint")]
        constraints = [models.UniqueConstraint(fields=["key"], name="clientcall_key")]
