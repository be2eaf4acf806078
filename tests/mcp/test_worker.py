"""MCP tools driven by a real Celery worker process: the worker starts the stdio
server per call, waits for a reviewer, then runs the destructive call exactly once."""

from __future__ import annotations

from agents.actions.approvals import approval_decide
from agents.models import Approval, Run, ToolCall
from tests.helpers import call, final, person, wait_for
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS


def test_worker_runs_an_approved_mcp_call_once_with_its_key(cluster: Cluster, stdio_server, mcp_launch, calls) -> None:
    cluster.start_worker("w1")
    run = mcp_launch(stdio_server, [
        call("files__lookup", record_id="alpha"),
        call("files__delete_record", record_id="alpha"),
        final("deleted"),
    ])
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(), what="an approval")
    assert approval.tool == "files__delete_record"
    assert calls() == []

    approval_decide(approval_id=approval.pk, user=person("rita", "reviewer"), decision="approve")
    wait_for(lambda: Run.objects.get(pk=run.pk).state == "done", what="the run to finish")
    delete = ToolCall.objects.get(run=run, tool="files__delete_record")
    assert delete.status == "succeeded", delete.result
    assert [(c["tool"], c["idempotency_key"]) for c in calls()] == [("delete_record", delete.idempotency_key)]
    assert Run.objects.get(pk=run.pk).answer == "deleted"


def test_worker_turns_a_server_dying_mid_call_into_outcome_unknown(
    cluster: Cluster, stdio_server, mcp_launch, calls
) -> None:
    from agents.models import McpTool

    McpTool.objects.filter(name="files__charge_card").update(risk_override="write")
    worker = cluster.start_worker("w1")
    run = mcp_launch(stdio_server, [call("files__charge_card", amount=3), final("charged")])
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(), what="an approval")
    assert approval.kind == "outcome_unknown" and "failed mid-call" in approval.reason
    assert [c["tool"] for c in calls()] == ["charge_card"]
    assert worker.poll() is None, "the server's death did not take the worker with it"
    assert ToolCall.objects.get(run=run).status == "started"
