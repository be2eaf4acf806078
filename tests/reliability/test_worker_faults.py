"""Real workers that freeze, get the same message twice, or die on a tool every time."""

from __future__ import annotations

import os
import re
import signal

from agents.models import AgentProfile, LedgerEntry, Run, ToolCall
from agents.runs.verify import verify_run
from tests.helpers import call, final, seqs, state_of, wait_for
from tests.reliability import fault_tools
from tests.workers.cluster import LEASE_SECONDS, MARKS, Cluster

pytestmark = MARKS


def test_a_frozen_worker_resumed_after_a_takeover_has_its_commit_refused(cluster: Cluster, launch) -> None:
    """SIGSTOP freezes the whole worker (its lease heartbeat thread too), so the lease
    lapses; another worker takes the run over and finishes it; SIGCONT lets the frozen
    one finish its tool and try to commit with the old version: refused."""
    frozen = cluster.start_worker("frozen")
    run = launch([call("sleep", seconds=3), call("ledger_write", entry="once"), final("thawed")])
    wait_for(
        lambda: ToolCall.objects.filter(run=run, tool="sleep").exists() and state_of(run.pk) == "acting",
        what="the frozen worker to start the sleep",
    )
    holder, at_freeze = Run.objects.values_list("lease_owner", "version").get(pk=run.pk)
    os.killpg(frozen.pid, signal.SIGSTOP)
    try:
        cluster.start_worker("rescuer")
        cluster.start_beat()
        wait_for(lambda: state_of(run.pk) == "done", timeout=90, what="the rescuer to finish the run")
        version = Run.objects.values_list("version", flat=True).get(pk=run.pk)
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    wait_for(
        lambda: f"stale run={run.pk}" in cluster.log("frozen"), timeout=60, what="the thawed worker's refused commit"
    )
    run.refresh_from_db()
    assert run.version == version and run.answer == "thawed"
    assert seqs(run) == list(range(1, run.version + 1))
    assert not run.transitions.filter(actor=holder).filter(seq__gt=at_freeze).exists()  # nothing after the freeze
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert verify_run(run) == []


def test_forced_redeliveries_are_logged_no_ops(cluster: Cluster, own_redis, launch) -> None:
    """A visibility timeout far below the task's length: Redis (a private one, whatever
    REDIS_URL says) hands the same message to the other pool process again and again
    while the first still works on it."""
    cluster.redis_url = own_redis.url
    cluster.start_worker(
        "w1",
        concurrency=2,
        AIRLOCK_VISIBILITY_TIMEOUT="1",
        AIRLOCK_UNACKED_RESTORE_INTERVAL="1",
        AIRLOCK_UNACKED_RESTORE_THROTTLE="1",
    )
    from agents.tasks import advance_run
    from config.celery import app

    run = launch([call("sleep", seconds=6), call("ledger_write", entry="once"), final("redelivered")])
    # The launch woke the test's configured broker; wake the run on the private one.
    with app.connection_for_write(own_redis.url) as connection:
        advance_run.apply_async((run.pk,), connection=connection)
    wait_for(lambda: state_of(run.pk) == "done", timeout=90, what="the run to finish")
    wait_for(
        lambda: re.search(rf"advance_run run={run.pk} no-op: .*redelivered=True", cluster.log("w1")),
        timeout=30,
        what="a redelivered message logged as a no-op",
    )
    run.refresh_from_db()
    # The worker logs a commit just after it lands: the run reads `done` a moment before
    # the last line is in the log.
    wait_for(
        lambda: f"committed run={run.pk} seq={run.version} " in cluster.log("w1"), timeout=30, what="the last commit's log line"
    )
    log = cluster.log("w1")
    assert seqs(run) == list(range(1, run.version + 1))
    for seq in range(2, run.version + 1):
        assert len(re.findall(rf"committed run={run.pk} seq={seq} ", log)) == 1, seq  # each seq written once
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert run.transitions.filter(kind="tool", payload__call__tool="sleep").count() == 1
    assert verify_run(run) == []


def test_a_poison_tool_fails_its_run_while_other_runs_keep_moving(cluster: Cluster, launch) -> None:
    # `crash` exits the process that runs it, every time (tests/reliability/fault_tools.py).
    AgentProfile.objects.filter(name="scripted").update(tools=None)
    # The threaded worker dies whole, with every run it holds, each time; the test
    # restarts it as a supervisor would.
    cluster.start_worker("w1", AIRLOCK_EXTRA_TOOLS=fault_tools.__name__)
    cluster.start_beat(AIRLOCK_EXTRA_TOOLS=fault_tools.__name__)
    poison = launch([call("crash"), final("never")])

    def crashed() -> bool:
        cluster.supervise("w1")
        return 71 in cluster.exits.get("w1", [])

    wait_for(crashed, what="the poison tool to kill the worker")
    others = [
        launch([call("echo", text=f"hi {i}"), call("ledger_write", entry=f"e{i}"), final(f"ok {i}")]) for i in range(6)
    ]
    ids = [r.pk for r in others]

    def settled() -> bool:
        cluster.supervise("w1")
        return Run.objects.filter(pk__in=[*ids, poison.pk], state__in=("done", "failed")).count() == 7

    wait_for(settled, timeout=180, what="the other runs and the poison run to end")
    assert Run.objects.filter(pk__in=ids, state="done").count() == 6
    poison.refresh_from_db()
    assert poison.state == "failed"
    assert poison.error.startswith("poison run: 3 worker leases in a row ended without progress"), poison.error
    assert cluster.exits["w1"].count(71) >= 3  # each claim died in the tool
    assert verify_run(poison) == []
    for run in Run.objects.filter(pk__in=ids):
        assert verify_run(run) == [] and LedgerEntry.objects.filter(run=run).count() == 1
    assert int(LEASE_SECONDS) < 10  # the fixture's short leases keep this test quick
