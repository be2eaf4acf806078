"""Every named crash point x {safe, unsafe} ledger tool, in REAL processes.

A worker started with AIRLOCK_CRASH_AT=<point> dies there (the threaded worker exits at
once, as a SIGKILL would), one worker per run; a normal worker plus the sweeper then
finish the runs. For `after_launch_commit` the process that dies is the one
launching (a web request's process, between the commit and the wake-up). The outcome
of each pair is written out here, not derived from the code.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents.lib import faults
from agents.models import Approval, LedgerEntry, Run, ToolCall
from agents.runs.verify import verify_run
from tests.helpers import call, final, wait_for
from tests.reliability.test_crash_points import EXPECTED
from tests.workers.cluster import BASE, MARKS, Cluster

pytestmark = MARKS

# EXPECTED is the in-process test's table: a real process dying at a crash point must end
# exactly as the simulated crash does.

LAUNCH = """
import django, json, sys
django.setup()
from agents.actions.runs import run_launch
run = run_launch(agent="scripted", task="launched by a dying process",
                 script=[{"call": {"tool": sys.argv[1], "args": {"entry": "effect"}}}, {"final": "finished"}])
print(json.dumps({"id": run.pk}))
"""


def test_the_table_covers_every_crash_point() -> None:
    assert set(EXPECTED) == faults.POINTS


def launch_in_a_dying_process(cluster: Cluster, tool: str) -> int:
    env = cluster.env(AIRLOCK_CRASH_AT="after_launch_commit", DJANGO_SETTINGS_MODULE="config.settings")
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH, tool], cwd=BASE, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 70, done.stderr  # died before printing, before the wake-up
    assert done.stdout == "" and "wake-up" not in done.stderr
    run = Run.objects.get(task="launched by a dying process", script__0__call__tool=tool)
    assert run.state == "queued"  # committed before the crash: not lost
    return run.pk


@pytest.mark.parametrize("point", sorted(EXPECTED))
def test_crash_point_in_a_real_worker(cluster: Cluster, launch, point: str) -> None:
    tools = sorted(EXPECTED[point])
    if point == "after_launch_commit":
        ids = {tool: launch_in_a_dying_process(cluster, tool) for tool in tools}
    else:
        # A threaded worker dies whole at the point, so each run gets a worker of its
        # own; the dead one's lease keeps the next from taking its run before the sweep.
        ids = {}
        for tool in tools:
            worker = cluster.start_worker("crashing", AIRLOCK_CRASH_AT=point)
            ids[tool] = launch([call(tool, entry="effect"), final("finished")]).pk
            assert worker.wait(timeout=60) == 70, f"{tool} run did not crash the worker at {point}"
        assert Run.objects.filter(pk__in=ids.values(), state__in=("done", "failed")).count() == 0
    cluster.start_worker("healthy")
    cluster.start_beat()
    for tool, run_id in ids.items():
        state, rows, kind = EXPECTED[point][tool]
        wait_for(
            lambda run_id=run_id, state=state: Run.objects.values_list("state", flat=True).get(pk=run_id) == state,
            timeout=60,
            what=f"{tool} run to reach {state} after {point}",
        )
        run = Run.objects.get(pk=run_id)
        assert LedgerEntry.objects.filter(run=run).count() == rows, (point, tool)
        kinds = list(Approval.objects.filter(run=run).values_list("kind", flat=True))
        assert kinds == ([kind] if kind else []), (point, tool)
        if kind == "outcome_unknown":
            assert "outcome unknown" in Approval.objects.get(run=run).reason
            assert ToolCall.objects.get(run=run).status == "started"  # no result: it may have happened
        seqs = list(run.transitions.order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))
        assert verify_run(run) == [], (point, tool)
