"""The reviewing metrics of GET /metrics: time to decision by agent and decision (a
person's answer or an expiry, folded from the transitions), and the escalation and
lapsed-claim counters (escalations tallied where they happen, lapsed claims counted
from the claims' rows)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from agents.actions.approvals import approval_decide, approval_expire
from agents.models import AgentProfile, Approval, ApprovalClaim, MetricTally
from agents.ops import metrics
from tests.helpers import at_once, person
from tests.operations.test_metrics import TOKEN, samples, scrape

pytestmark = pytest.mark.django_db

FAMILY = "airlock_approval_decision_seconds"


def wait_of(approval: Approval) -> float:
    approval.refresh_from_db()
    assert approval.decided_at is not None
    return (approval.decided_at - approval.created_at).total_seconds()


@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN, AIRLOCK_METRICS_FOLD_LAG_SECONDS=0)
def test_decisions_and_expiries_are_timed_by_agent_and_decision(
    pending: Callable[..., Approval], defaults: None
) -> None:
    rita = person("rita", "reviewer")
    AgentProfile.objects.filter(name="scripted").update(approval_timeout_seconds=60)
    approved, rejected, expiring = pending(), pending(), pending()
    approval_decide(approval_id=approved.pk, user=rita, decision="approve")
    approval_decide(approval_id=rejected.pk, user=rita, decision="reject", note="no")
    assert approval_expire(approval_id=expiring.pk, owner="test-sweeper", now=expiring.expires_at.timestamp() + 1)
    families = scrape()

    counts = samples(families, FAMILY, f"{FAMILY}_count")
    assert counts == {("scripted", "approve"): 1, ("scripted", "reject"): 1, ("scripted", "expire"): 1}
    sums = samples(families, FAMILY, f"{FAMILY}_sum")
    assert sums[("scripted", "approve")] == pytest.approx(wait_of(approved), abs=0.002)
    assert sums[("scripted", "expire")] == pytest.approx(wait_of(expiring), abs=0.002)
    # Each lands in the bucket of its wait: all under 10 s here.
    buckets = {
        (s.labels["decision"], s.labels["le"]): s.value for s in families[FAMILY].samples if s.name.endswith("_bucket")
    }
    assert buckets[("approve", "10")] == buckets[("approve", "+Inf")] == 1
    # A second scrape folds nothing twice.
    assert samples(scrape(), FAMILY, f"{FAMILY}_count") == counts
    # The older histogram by tool still counts people's decisions only.
    waits = samples(families, "airlock_approval_wait_seconds", "airlock_approval_wait_seconds_count")
    assert waits == {("ledger_write",): 2}


@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN)
def test_escalations_count_what_was_observed(defaults: None) -> None:
    assert samples(scrape(), "airlock_approval_escalations", "airlock_approval_escalations_total") == {}
    metrics.observe_escalation("demo")
    metrics.observe_escalation("demo")
    metrics.observe_escalation("scripted")
    with pytest.raises(RuntimeError), transaction.atomic():
        # Counted in the caller's transaction: one that rolls back counted nothing.
        metrics.observe_escalation("demo")
        raise RuntimeError("the escalation did not commit")
    assert samples(scrape(), "airlock_approval_escalations", "airlock_approval_escalations_total") == {
        ("demo",): 2, ("scripted",): 1
    }


@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN)
def test_lapsed_claims_count_recorded_lapses_and_those_not_yet_recorded(
    pending: Callable[..., Approval], defaults: None
) -> None:
    assert samples(scrape(), "airlock_claims_lapsed", "airlock_claims_lapsed_total") == {(): 0}
    rita = person("rita", "reviewer")
    approval = pending()
    now = timezone.now()
    ApprovalClaim.objects.create(approval=approval, user=rita, until=now - dt.timedelta(minutes=5), ended_at=now, end="lapsed")
    ApprovalClaim.objects.create(approval=approval, user=rita, until=now - dt.timedelta(minutes=1))  # ran out, unrecorded
    ApprovalClaim.objects.create(approval=approval, user=rita, until=now + dt.timedelta(minutes=9))  # live
    ApprovalClaim.objects.create(approval=approval, user=rita, until=now, ended_at=now, end="released")
    assert samples(scrape(), "airlock_claims_lapsed", "airlock_claims_lapsed_total") == {(): 2}


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_observations_all_count(defaults: None) -> None:
    at_once(lambda _: metrics.observe_escalation("racing"), range(8))
    tally = MetricTally.objects.get(name=metrics.ESCALATIONS, labels=metrics._labels("racing"))
    assert tally.count == 8


def test_the_decision_labels_are_a_fixed_list() -> None:
    assert metrics.DECISION_LABELS == ("approve", "reject", "happened", "retry", "fail", "reuse", "expire")

