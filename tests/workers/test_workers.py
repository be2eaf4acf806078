"""Real `celery worker` processes advancing runs: many at once, duplicate deliveries,
workers killed mid-tool and between transitions, a broker that is down at launch."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest

from agents.actions.approvals import approval_decide
from agents.models import Approval, LedgerEntry, Run, ToolCall
from agents.runs.verify import verify_run
from agents.tasks import advance_run
from tests.helpers import call, final, seqs, state_of, wait_for
from tests.workers.cluster import BASE, MARKS, Cluster

pytestmark = MARKS


def test_fifty_runs_launched_at_once_all_finish_on_two_workers(cluster: Cluster, launch) -> None:
    from django.core.management import call_command

    cluster.start_worker("w1")
    cluster.start_worker("w2")
    runs = [
        launch([call("echo", text=f"hello {i}"), call("ledger_write", entry=f"run {i}"), final(f"answer {i}")])
        for i in range(50)
    ]
    ids = [r.pk for r in runs]
    wait_for(lambda: Run.objects.filter(pk__in=ids, state="done").count() == 50, timeout=180, what="50 runs done")
    assert LedgerEntry.objects.filter(run_id__in=ids).count() == 50
    for run in Run.objects.filter(pk__in=ids):
        assert seqs(run) == [1, 2, 3, 4, 5, 6, 7], run.pk
        assert run.answer == f"answer {ids.index(run.pk)}"
    actors = set(Run.objects.filter(pk__in=ids).values_list("transitions__actor", flat=True)) - {"system"}
    assert len(actors) >= 2, f"both workers took runs: {actors}"
    from io import StringIO

    out = StringIO()
    call_command("verify_runs", *map(str, ids), stdout=out)
    assert "50 run(s) checked, 0 inconsistent" in out.getvalue()


def test_ten_deliveries_of_the_same_run_commit_each_transition_once(cluster: Cluster, launch) -> None:
    cluster.start_worker("w1", concurrency=2)
    cluster.start_worker("w2", concurrency=2)
    script = [call("ledger_write_unsafe", entry=f"write {i}") for i in range(4)] + [call("sleep", seconds=0.2), final()]
    run = launch(script)
    for _ in range(10):
        advance_run.delay(run.pk)
    wait_for(lambda: state_of(run.pk) == "done", timeout=60, what="run done")
    run.refresh_from_db()
    # launch, pickup, (call -> acting, tool -> planning) x 5, final
    assert seqs(run) == list(range(1, 14))
    assert verify_run(run) == []
    entries = sorted(LedgerEntry.objects.filter(run=run).values_list("entry", flat=True))
    assert entries == [f"write {i}" for i in range(4)]
    assert (
        list(ToolCall.objects.filter(run=run, tool="ledger_write_unsafe").values_list("attempts", flat=True)) == [1] * 4
    )
    assert f"committed run={run.pk} seq=13 planning->done" in cluster.log("w1") + cluster.log("w2")


def test_worker_killed_during_a_sleep_another_worker_finishes_after_the_lease(cluster: Cluster, launch) -> None:
    cluster.start_worker("w1")
    cluster.start_beat()
    run = launch([call("sleep", seconds=5), call("ledger_write", entry="after the nap"), final("rested")])
    wait_for(
        lambda: ToolCall.objects.filter(run=run, tool="sleep").exists() and state_of(run.pk) == "acting",
        what="the sleep to start",
    )
    time.sleep(0.5)  # let the tool thread get into its sleep
    cluster.kill("w1")
    died_holding = Run.objects.values_list("lease_owner", flat=True).get(pk=run.pk)
    assert died_holding and died_holding.startswith("worker:")
    cluster.start_worker("w2")
    wait_for(lambda: state_of(run.pk) == "done", timeout=60, what="run done by w2")
    run.refresh_from_db()
    assert run.answer == "rested" and verify_run(run) == []
    slept = run.transitions.get(kind="tool", payload__call__tool="sleep")
    assert slept.actor != died_holding  # the survivor ran the tool again and recorded it
    assert LedgerEntry.objects.filter(run=run).count() == 1


def crash_after_tool(cluster: Cluster, launch, tool: str) -> Run:
    """Worker w1 dies right after `tool` ran, before its result is committed."""
    cluster.start_worker("w1", AIRLOCK_CRASH_AT="after_tool_before_result_commit")
    run = launch([call(tool, entry="pay supplier 42"), final("paid")])
    wait_for(lambda: LedgerEntry.objects.filter(run=run).exists(), what=f"{tool} to run once")
    cluster.kill("w1")
    assert state_of(run.pk) == "acting"
    cluster.start_worker("w2")
    cluster.start_beat()
    return run


def test_safe_write_interrupted_before_its_result_is_recorded_once(cluster: Cluster, launch) -> None:
    run = crash_after_tool(cluster, launch, "ledger_write")
    wait_for(lambda: state_of(run.pk) == "done", what="run done")
    run.refresh_from_db()
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert verify_run(run) == []


def test_unsafe_write_interrupted_waits_for_a_human_with_outcome_unknown(cluster: Cluster, launch) -> None:
    from django.contrib.auth.models import User

    run = crash_after_tool(cluster, launch, "ledger_write_unsafe")
    wait_for(lambda: state_of(run.pk) == "awaiting_approval", what="run awaiting approval")
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "outcome_unknown" and "outcome unknown" in approval.reason
    assert LedgerEntry.objects.filter(run=run).count() == 1
    reviewer = User.objects.create_user("rita")
    approval_decide(approval_id=approval.pk, user=reviewer, decision="happened", note="I see the payment")
    wait_for(lambda: state_of(run.pk) == "done", what="run done after the decision")
    assert LedgerEntry.objects.filter(run=run).count() == 1  # not run again
    assert verify_run(Run.objects.get(pk=run.pk)) == []


def test_workers_killed_at_random_points_of_a_long_run(cluster: Cluster, launch) -> None:
    rng = random.Random(20261129)
    batch1 = [{"tool": "ledger_write", "args": {"entry": f"a{i}"}} for i in range(4)] + [
        {"tool": "sleep", "args": {"seconds": 0.4 + i / 100}} for i in range(4)
    ]
    batch2 = [{"tool": "ledger_write", "args": {"entry": f"b{i}"}} for i in range(4)] + [
        {"tool": "echo", "args": {"text": f"e{i}"}} for i in range(4)
    ]
    script = [{"calls": batch1}, {"calls": batch2}, final("survived")]
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    cluster.start_beat()
    run = launch(script)
    kills = 0
    while kills < 5 and state_of(run.pk) != "done":
        time.sleep(rng.uniform(0.2, 1.2))
        victim = rng.choice(["w1", "w2"])
        cluster.kill(victim)
        kills += 1
        cluster.start_worker(victim)
    wait_for(lambda: state_of(run.pk) == "done", timeout=120, what="run done")
    run.refresh_from_db()
    assert run.answer == "survived" and verify_run(run) == []
    assert seqs(run) == list(range(1, len(seqs(run)) + 1))
    tools = list(run.transitions.filter(kind="tool").values_list("payload__call__id", flat=True))
    assert len(tools) == 16 and len(set(tools)) == 16  # each call's result recorded once
    entries = sorted(LedgerEntry.objects.filter(run=run).values_list("entry", flat=True))
    assert entries == sorted([f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)])
    assert kills >= 3, "the run outlived several kills"
    assert len(set(run.transitions.filter(actor__startswith="worker:").values_list("actor", flat=True))) >= 2


def test_sweeper_fails_a_run_past_its_deadline_while_awaiting_approval(cluster: Cluster, launch, drive) -> None:
    from django.contrib.auth.models import User

    script = [call("fetch_fixture", text="a page"), call("ledger_write", entry="tainted write"), final()]
    run = drive(launch(script, limits={"deadline_seconds": 3}))
    assert run.state == "awaiting_approval"
    approval = Approval.objects.get(run=run)
    cluster.start_worker("w1")
    cluster.start_beat()
    wait_for(lambda: state_of(run.pk) == "failed", what="the sweeper to fail the run")
    run.refresh_from_db()
    assert run.error.startswith("deadline passed")
    last = run.transitions.order_by("-seq").first()
    assert last.from_state == "awaiting_approval" and last.actor.startswith("sweeper:")
    approval.refresh_from_db()
    assert approval.status == "expired"
    version = run.version
    result = approval_decide(approval_id=approval.pk, user=User.objects.create_user("late"), decision="approve")
    assert not result.won and result.approval.status == "expired"
    assert result.approval.decided_by is None and result.approval.run.error.startswith("deadline passed")
    run.refresh_from_db()
    assert run.state == "failed" and run.version == version
    assert LedgerEntry.objects.filter(run=run).count() == 0


LAUNCH = """
import django, json
django.setup()
from agents.actions.runs import run_launch
run = run_launch(agent="scripted", task="launched while the broker is down",
                 script=[{"call": {"tool": "echo", "args": {"text": "hi"}}}, {"final": "made it"}])
print(json.dumps({"id": run.pk, "state": run.state}))
"""


def test_launch_commits_while_the_broker_is_down_and_runs_once_it_is_back(
    cluster: Cluster, private_redis, defaults
) -> None:
    url = private_redis.url  # nothing listens there yet
    env = cluster.env(REDIS_URL=url, DJANGO_SETTINGS_MODULE="config.settings")
    done = subprocess.run([sys.executable, "-c", LAUNCH], cwd=BASE, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    launched = json.loads(done.stdout.strip().splitlines()[-1])
    assert f"wake-up for run={launched['id']} not sent" in done.stderr
    assert launched["state"] == "queued" and state_of(launched["id"]) == "queued"
    private_redis()  # the broker comes back
    cluster.redis_url = url
    cluster.start_worker("w1")
    cluster.start_beat()
    wait_for(lambda: state_of(launched["id"]) == "done", what="the sweeper to wake the run")
    run = Run.objects.get(pk=launched["id"])
    assert run.answer == "made it" and verify_run(run) == []


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_tool_that_kills_its_worker_every_time_is_failed_as_poison(cluster: Cluster, launch, pool: str) -> None:
    # Every claim dies inside the tool; the count in the database ends the loop. A
    # prefork worker replaces its dead pool process; a threaded worker dies whole, and
    # its supervisor (compose's restart policy, here the test) starts it again.
    cluster.start_worker("w1", pool=pool, AIRLOCK_CRASH_AT="after_tool_before_result_commit")
    cluster.start_beat()
    run = launch([call("ledger_write", entry="crashes its worker"), final()])

    def failed() -> bool:
        cluster.supervise("w1")
        return state_of(run.pk) == "failed"

    wait_for(failed, timeout=120, what="the poison run to be failed")
    run.refresh_from_db()
    assert run.error.startswith("poison run: 3 worker leases in a row ended without progress")
    assert verify_run(run) == []
    assert LedgerEntry.objects.filter(run=run).count() == 1  # safe tool: same key each time
