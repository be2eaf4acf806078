"""`approval.expiring`: the sweeper warns once when a fifth of an approval's time is left."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from agents.models import Approval, OutboxEvent
from agents.tasks import sweep
from tests.helpers import call

pytestmark = pytest.mark.django_db(transaction=True)


def waiting(launch, drive):  # type: ignore[no-untyped-def]
    run = launch([call("ledger_write_unsafe", entry="x")], policy={"rules": [
        {"tool": "ledger_write_unsafe", "then": "ask", "reason": "ask"}], "approval_timeout_seconds": 100})
    drive(run)
    return Approval.objects.pending().get(run=run)


def test_no_warning_while_more_than_a_fifth_is_left(launch, drive) -> None:  # type: ignore[no-untyped-def]
    approval = waiting(launch, drive)
    assert approval.expires_at is not None
    sweep()
    assert not OutboxEvent.objects.filter(approval=approval, type="approval.expiring").exists()


def test_one_warning_when_a_fifth_is_left_however_often_the_sweeper_runs(launch, drive) -> None:  # type: ignore[no-untyped-def]
    approval = waiting(launch, drive)
    # 100 s timeout: move its start back 85 s, so 15 s (under a fifth) are left.
    Approval.objects.filter(pk=approval.pk).update(
        created_at=approval.created_at - dt.timedelta(seconds=85),
        expires_at=timezone.now() + dt.timedelta(seconds=15),
    )
    assert sweep()["expiring"] == 1
    assert sweep()["expiring"] == 0
    events = OutboxEvent.objects.filter(approval=approval, type="approval.expiring")
    assert events.count() == 1
    assert Approval.objects.get(pk=approval.pk).status == "pending"  # a warning, not an expiry
