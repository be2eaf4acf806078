"""The 0028 migration's backfill: the streaks of the calls the tallies had already
folded, walked in the order of their decisions (later calls are the sweeper's)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agents.models import Approval, ReviewStreak
from tests.helpers import person
from tests.reviews import rows

BEFORE = [("agents", "0027_statsperf")]
BACKFILL = [("agents", "0028_fatigue_streaks")]


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_the_backfill_walks_the_folded_calls_into_streaks(defaults: None) -> None:
    rob = person("rob", "reviewer")
    run = rows.a_run("scripted")
    r1, r2 = rows.profile_rule(1), rows.profile_rule(2)
    # Rule 1, oldest first: three approved, a reject, two approved: a streak of 2 since the reject.
    ages = [6000, 5000, 4000, 3000, 2000, 1000]
    one = [rows.approval(run, by=rob, rule=r1, closed_ago=ago, status="rejected" if ago == 3000 else "approved")
           for ago in ages]
    # Rule 2: four approved, one of them irreversible and one needing two votes.
    two = [rows.approval(run, by=rob, rule=r2, closed_ago=ago, risk="irreversible" if ago == 4000 else "write",
                         required=2 if ago == 3000 else 1) for ago in ages[:4]]
    # No rule: approved, then an edit (not unchanged): a streak of 0, broken by the edit.
    none = [rows.approval(run, by=rob, closed_ago=800), rows.approval(run, by=rob, closed_ago=700, edited=True)]
    rows.approval(run, by=rob, closed_ago=600, rule={**r1, "origin": "launch"})  # no profile rule could answer it
    late = rows.approval(run, by=rob, rule=r1, closed_ago=500, status="rejected")  # not folded yet: the sweeper's
    Approval.objects.exclude(pk=late.pk).update(tallied=True)
    try:
        _migrate(BEFORE)
        _migrate(BACKFILL)
        got = {
            (s.tool, s.origin, s.index): (s.length, s.irreversible, s.votes, s.broken_id, s.last_id)
            for s in ReviewStreak.objects.all()
        }
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes("agents"))
    assert got == {
        ("ledger_write", "profile", 1): (2, False, 1, one[3].pk, one[5].pk),
        ("ledger_write", "profile", 2): (4, True, 2, 0, two[3].pk),
        ("ledger_write", "", 0): (0, False, 1, none[1].pk, none[1].pk),
    }
