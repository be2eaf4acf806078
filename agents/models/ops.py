"""Operations' own rows: the folded metric tallies /metrics reads, the purges' audit.
The review statistics' rows are in review_stats.py."""

from __future__ import annotations

from django.conf import settings
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


class PurgeRecord(models.Model):
    """One purge (agents/runs/retention.py): when, by whom or by the schedule, the
    cut-off, what it removed. Never any content of the runs it purged."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    actor = models.CharField(max_length=150, help_text="a username, or 'schedule'")
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    older_than_days = models.PositiveIntegerField(null=True, blank=True, help_text="empty: each profile's retention")
    cutoff = models.DateTimeField(null=True, blank=True, help_text="finished before this (with --older-than)")
    agent = models.CharField(max_length=64, blank=True)
    runs = models.PositiveIntegerField(default=0)
    rows = models.JSONField(default=dict, help_text="rows deleted or emptied, by table")
    bytes = models.PositiveBigIntegerField(default=0, help_text="content bytes removed")
    exported_to = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"purge of {self.runs} run(s) at {self.started_at:%Y-%m-%d %H:%M} by {self.actor}"
