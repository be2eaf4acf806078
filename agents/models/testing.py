"""A test instrument, not a product table: the diagnostic tools (`ledger_write`,
`ledger_write_unsafe`, the demo's refund) record one row per side effect here, which is
how the suite and the evals count effects."""

from __future__ import annotations

from django.db import models


class LedgerEntry(models.Model):
    """Side effects of the diagnostic ledger tools: how tests count executions."""

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="ledger")
    idempotency_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    entry = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
