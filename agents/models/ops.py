"""Operations' own rows: the folded metric tallies /metrics reads."""

from __future__ import annotations

from django.db import models


class MetricTally(models.Model):
    """Counters and histogram buckets folded from the append-only transition log.

    `GET /metrics` folds the transitions committed since the last scrape into these
    rows (agents/ops/metrics.py), so the totals cost the hot path nothing and are exact
    whatever process died. The row named `_folded_through` holds the last transition id
    folded, in `total`.
    """

    name = models.CharField(max_length=40)
    labels = models.CharField(max_length=300, blank=True, help_text="label values joined by '|'")
    bucket = models.SmallIntegerField(default=-1, help_text="histogram bucket index; -1 for a counter")
    count = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "labels", "bucket"], name="tally_name_labels_bucket")]
