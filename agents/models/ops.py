"""Operations' own rows: the folded metric tallies /metrics reads, the purges' audit."""

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


class ReviewTally(models.Model):
    """How many closed calls, per UTC day of their decision, agent, rule that asked,
    escalated or not, reviewer and status (agents/ops/review_tally.py folds them)."""

    day = models.DateField()
    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+")
    origin = models.CharField(max_length=20, blank=True, help_text="the rule's origin; '' for no rule")
    index = models.IntegerField(default=0, help_text="the rule's index; 0 for no rule")
    escalated = models.BooleanField(default=False)
    # The deciding user's id, 0 for none; not a foreign key: a deleted user's calls stay
    # counted, shown as "(deleted user)" as the exact figures show them.
    reviewer = models.IntegerField(default=0)
    status = models.CharField(max_length=10)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "profile", "origin", "index", "escalated", "reviewer", "status"], name="reviewtally_key",
            )
        ]


class ReviewStreak(models.Model):
    """Approval fatigue folded ahead: per agent, tool and rule that asked, the calls
    approved unchanged in a row since the newest that was not (a reject, an expiry, an
    edit), as agents/engine/streaks.py folds them (agents/ops/review_tally.py). A purged
    run's calls stay counted."""

    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+")
    tool = models.CharField(max_length=100)
    origin = models.CharField(max_length=20, blank=True, help_text="the rule's origin; '' for no rule")
    index = models.IntegerField(default=0, help_text="the rule's index; 0 for no rule")
    length = models.IntegerField(default=0)
    irreversible = models.BooleanField(default=False, help_text="one call of the streak was an irreversible tool's")
    votes = models.PositiveSmallIntegerField(default=1, help_text="the most votes a call of the streak needed")
    # The newest call that broke the streak, and the newest call folded: (decided_at, id).
    broken_at = models.DateTimeField(null=True, blank=True)
    broken_id = models.BigIntegerField(default=0)
    last_at = models.DateTimeField(null=True, blank=True)
    last_id = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["profile", "tool", "origin", "index"], name="reviewstreak_key")
        ]


class ReviewTiming(models.Model):
    """Time to decision of the calls a person answered, as counts per log-spaced bucket
    (`bucket` = floor(8 * log2(seconds))), per UTC day, agent, rule and escalated."""

    day = models.DateField()
    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+")
    origin = models.CharField(max_length=20, blank=True)
    index = models.IntegerField(default=0)
    escalated = models.BooleanField(default=False)
    bucket = models.SmallIntegerField()
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "profile", "origin", "index", "escalated", "bucket"], name="reviewtiming_key"
            )
        ]


class ReviewTallyVersion(models.Model):
    """One row: bumped by the fold, in its transaction, whenever it adds to a UTC day
    before its own (a call folded late). The stats page caches the sums of whole days
    older than yesterday keyed by it (reviews/stats.py), so those stay right."""

    version = models.BigIntegerField(default=0)


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
