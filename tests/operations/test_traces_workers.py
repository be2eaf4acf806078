"""A run resumed on another worker after a crash continues the same trace: real Celery
workers export through the OTLP/HTTP exporter to a loopback receiver; the first worker
is SIGKILLed mid-tool."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from agents.models import Run, ToolCall
from tests.helpers import call, final, wait_for
from tests.operations import otlp
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS


@pytest.fixture
def receiver() -> Iterator[otlp.Receiver]:
    yield from otlp.serve()


def test_a_run_resumed_after_a_worker_kill_keeps_one_trace(cluster: Cluster, launch, receiver) -> None:
    tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    cluster.start_worker("w1", **tracing)
    cluster.start_beat()
    with override_settings(AIRLOCK_OTEL=True):  # the launch stores the run's trace context
        run = launch([call("echo", text="before"), call("sleep", seconds=5), call("echo", text="after"), final("rested")])
    _, trace_id, root_id, _ = run.trace_context.split("-")

    wait_for(lambda: ToolCall.objects.filter(run=run, tool="sleep").exists(), what="the sleep to start")
    wait_for(lambda: len(receiver.of_trace(trace_id)) >= 3, what="w1's spans (chat, echo, chat) exported")
    time.sleep(0.5)  # let the tool thread get into its sleep
    cluster.kill("w1")
    died_holding = Run.objects.values_list("lease_owner", flat=True).get(pk=run.pk)
    assert died_holding and died_holding.startswith("worker:")
    cluster.start_worker("w2", **tracing)
    wait_for(lambda: Run.objects.values_list("state", flat=True).get(pk=run.pk) == "done", timeout=60, what="done")
    wait_for(lambda: any(s.name.startswith("invoke_agent") for s in receiver.of_trace(trace_id)), what="the root span")

    run.refresh_from_db()
    spans = receiver.of_trace(trace_id)
    [root] = [s for s in spans if s.name.startswith("invoke_agent")]
    assert root.span_id == root_id and root.attributes["airlock.run.state"] == "done"
    assert all(s.parent_span_id == root_id for s in spans if s is not root)
    # Every model call and every recorded tool call of the run is in this one trace,
    # those w1 committed before it died and those w2 committed after.
    chats = [s for s in spans if s.name.startswith("chat ")]
    tools = sorted(s.attributes["gen_ai.tool.name"] for s in spans if s.name.startswith("execute_tool "))
    assert len(chats) == run.transitions.filter(kind="model").count() == 4
    assert tools == sorted(run.transitions.filter(kind="tool").values_list("payload__call__tool", flat=True))
    assert tools == ["echo", "echo", "sleep"]
    actors = set(run.transitions.filter(kind__in=("model", "tool")).values_list("actor", flat=True))
    assert died_holding in actors and len(actors) == 2, actors
