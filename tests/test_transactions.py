"""The check of tests/transactions.py can fail: a tool that writes from the driver's
thread inside a test's transaction is noted (and would fail the test), one in a test
with a real commit is not."""

from __future__ import annotations

import pytest

from agents.models import LedgerEntry
from tests import transactions
from tests.helpers import call, final


@pytest.mark.django_db
def test_a_tool_writing_inside_the_tests_transaction_is_noted(request: pytest.FixtureRequest, launch, drive) -> None:
    run = drive(launch([call("ledger_write", entry="x"), final()]))
    # Taken back, so this test itself passes: the note is what would have failed it.
    noted = transactions._used.pop(request.node.nodeid)
    assert noted
    assert LedgerEntry.objects.filter(run=run).count() == 0  # the write a test would have missed


@pytest.mark.django_db(transaction=True)
def test_with_a_real_commit_the_tool_writes_and_nothing_is_noted(request: pytest.FixtureRequest, launch, drive) -> None:
    run = drive(launch([call("ledger_write", entry="x"), final()]))
    assert request.node.nodeid not in transactions._used
    assert LedgerEntry.objects.filter(run=run).count() == 1
