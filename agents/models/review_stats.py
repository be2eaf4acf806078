"""The review statistics' rows (/reviews/stats/, reviews/stats/): the daily tallies of
closed calls and their time to decision, approval fatigue's streaks, and the version
the page's cache of past days is keyed by. agents/ops/review_tally.py folds them."""

from __future__ import annotations

from django.db import models


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
    older than yesterday keyed by it (reviews/stats/tallied.py), so those stay right."""

    version = models.BigIntegerField(default=0)
