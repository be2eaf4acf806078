"""Every named crash point x {safe, unsafe} ledger tool, in-process.

The process "dies" (SimulatedCrash) at the point; a fresh driver resumes the run. The
expected outcome of each pair is written out here, not derived from the code.
"""

from __future__ import annotations

import pytest

from agents.lib import faults
from agents.models import Approval, Run
from tests.helpers import call, final

pytestmark = pytest.mark.django_db(transaction=True)

# point -> tool -> (state after resume, ledger rows, approval kind or None)
EXPECTED = {
    "before_intent_commit": {
        "ledger_write": ("done", 1, None),
        "ledger_write_unsafe": ("done", 1, None),
    },
    "after_intent_commit": {
        "ledger_write": ("done", 1, None),
        "ledger_write_unsafe": ("done", 1, None),  # "intended": it never started
    },
    "after_tool_before_result_commit": {
        "ledger_write": ("done", 1, None),  # re-run with the same key, deduplicated
        "ledger_write_unsafe": ("awaiting_approval", 1, "outcome_unknown"),
    },
    "after_transition_commit": {
        "ledger_write": ("done", 1, None),
        "ledger_write_unsafe": ("done", 1, None),
    },
    "after_launch_commit": {
        "ledger_write": ("done", 1, None),
        "ledger_write_unsafe": ("done", 1, None),
    },
}
CASES = [(point, tool, *outcome) for point, tools in EXPECTED.items() for tool, outcome in tools.items()]


def test_the_table_covers_every_crash_point() -> None:
    assert set(EXPECTED) == faults.POINTS


@pytest.mark.parametrize("point, tool, state, rows, approval_kind", CASES)
def test_crash_point_outcome(launch, drive, monkeypatch, point, tool, state, rows, approval_kind) -> None:
    monkeypatch.setattr(faults, "MODE", "raise")
    monkeypatch.setattr(faults, "CRASH_AT", frozenset({point}))
    script = [call(tool, entry="effect"), final("finished")]
    if point == "after_launch_commit":
        with pytest.raises(faults.SimulatedCrash):
            launch(script)
        run = Run.objects.get()
        assert run.state == "queued"  # committed before the crash: not lost
    else:
        run = launch(script)
        with pytest.raises(faults.SimulatedCrash):
            drive(run)
    monkeypatch.setattr(faults, "CRASH_AT", frozenset())
    # A dead worker's lease lapses; the next driver may take the run.
    Run.objects.filter(pk=run.pk).update(lease_owner=None, lease_expires=None)
    run = drive(run)
    assert run.state == state, run.error
    assert run.ledger.count() == rows
    kinds = list(Approval.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds == ([approval_kind] if approval_kind else [])
    seqs = list(run.transitions.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
