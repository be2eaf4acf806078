"""One threaded worker keeps dozens of waiting runs in flight, and killing
it kills all of them at once without losing one or repeating a side effect."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_launch
from agents.models import AgentProfile, Approval, LedgerEntry, Run
from agents.runs.verify import verify_run
from bench.waiting import Sampler, SlowProvider
from tests.helpers import call, final, wait_for
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS


@pytest.fixture
def slow_model() -> Iterator[SlowProvider]:
    """Three model calls of 1 s per run (two ask for a 0.5 s sleep), over HTTP."""
    AgentProfile.objects.create(name="slow", provider="openai", model_name="slow-1", tools=["sleep"])
    with SlowProvider(delay=1.0, calls=3, tool="sleep", tool_seconds=0.5) as provider:
        yield provider


def test_forty_runs_waiting_on_a_slow_model_are_in_flight_together(cluster: Cluster, slow_model: SlowProvider) -> None:
    cluster.start_worker("w1", OPENAI_BASE_URL=slow_model.url)
    ids = [run_launch(agent="slow", task=f"wait {i}").pk for i in range(40)]
    with Sampler(ids) as sampler:
        wait_for(lambda: Run.objects.filter(pk__in=ids, state="done").count() == 40, timeout=180, what="40 runs done")
    # The default pool (32 threads): far more than the two runs of the old prefork default.
    assert sampler.most_in_flight >= 16, f"only {sampler.most_in_flight} runs in flight at once"
    assert slow_model.requests == 40 * 3
    for run in Run.objects.filter(pk__in=ids):
        assert run.answer == "done after 3 calls" and verify_run(run) == []


def answer_outcome_unknown(reviewer: User, ids: list[int]) -> int:
    """Answer every "outcome unknown" question from the ledger, as a person would: it
    happened if its row is there, else run it again. Returns how many were answered."""
    answered = 0
    for approval in Approval.objects.filter(run_id__in=ids, status="pending", kind="outcome_unknown"):
        entry = approval.args["entry"]
        happened = LedgerEntry.objects.filter(run_id=approval.run_id, entry=entry).exists()
        decision = "happened" if happened else "retry"
        approval_decide(approval_id=approval.pk, user=reviewer, decision=decision, note="checked the ledger")
        answered += 1
    return answered


def test_a_threaded_worker_killed_with_thirty_runs_in_flight_loses_none(cluster: Cluster, launch) -> None:
    cluster.start_worker("w1")
    runs = [
        launch(
            [
                call("ledger_write", entry=f"safe {i}"),
                call("sleep", seconds=1.5),
                call("ledger_write_unsafe", entry=f"unsafe {i}"),
                call("sleep", seconds=1.6),
                final(f"run {i}"),
            ]
        )
        for i in range(30)
    ]
    ids = [r.pk for r in runs]
    wait_for(
        lambda: Run.objects.filter(pk__in=ids, lease_owner__startswith="worker:").count() == 30,
        timeout=60,
        what="30 runs held by the worker at once",
    )
    held = set(Run.objects.filter(pk__in=ids).values_list("lease_owner", flat=True))
    assert len(held) > 1, "the runs are held by the worker's threads, each under its own name"
    cluster.kill("w1")
    cluster.start_worker("w2")
    cluster.start_beat()
    reviewer = User.objects.create_user("rita")

    def all_done() -> bool:
        answer_outcome_unknown(reviewer, ids)
        return Run.objects.filter(pk__in=ids, state="done").count() == 30

    wait_for(all_done, timeout=180, what="30 runs done after the kill")
    for i, run in enumerate(Run.objects.filter(pk__in=ids).order_by("pk")):
        assert run.answer == f"run {i}" and verify_run(run) == []
        entries = sorted(LedgerEntry.objects.filter(run=run).values_list("entry", flat=True))
        assert entries == [f"safe {i}", f"unsafe {i}"], run.pk
