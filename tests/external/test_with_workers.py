"""An external run beside real `celery worker` and `celery beat` processes: they pick
it up and leave it to its client, and after an approval a worker runs Airlock's tool
once while the client long-polls for the result."""

from __future__ import annotations

from agents.models import LedgerEntry, Run
from agents.runs.verify import verify_run
from tests.helpers import state_of, wait_for
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS

ASK_LEDGER = {"tool": "ledger_write_unsafe", "then": "ask", "reason": "a human signs the ledger"}


def test_a_worker_runs_an_approved_registry_call_once_and_the_long_poll_gets_it(
    cluster: Cluster, api, external_run
) -> None:
    cluster.start_worker("w1", concurrency=2)
    cluster.start_beat()
    run_id = external_run(policy={"rules": [ASK_LEDGER]})
    wait_for(lambda: state_of(run_id) == "planning", timeout=60, what="a worker picked the run up")
    lena = api("lena")
    held = lena.post(f"/api/runs/{run_id}/calls", {"tool": "ledger_write_unsafe", "args": {"entry": "pay 1"}}).data
    assert held["status"] == "pending"
    decided = api("rita").post(f"/api/approvals/{held['approval']['id']}/decision", {"decision": "approve"})
    assert decided.status_code == 200

    def settled() -> bool:
        return lena.get(f"/api/runs/{run_id}/calls/{held['key']}?wait=5").data["status"] == "succeeded"

    wait_for(settled, timeout=60, what="the call's result")
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 1
    run = Run.objects.get(pk=run_id)
    assert run.state == "planning" and verify_run(run) == []
    kinds = list(run.transitions.order_by("seq").values_list("kind", "actor"))
    assert [k for k, _ in kinds] == ["launch", "pickup", "model", "decision", "tool"]
    assert kinds[1][1].startswith("worker:") and kinds[4][1].startswith("worker:")
