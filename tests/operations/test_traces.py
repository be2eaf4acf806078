"""OpenTelemetry traces: one trace per run, GenAI span names and attributes, Airlock's
facts as airlock.* attributes, content only when asked, nothing when off. Captured with
the SDK's in-memory exporter, and once through the real OTLP/HTTP exporter to a
loopback receiver that decodes the protobuf."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents.actions.approvals import approval_decide
from agents.models import Approval, Run, ToolCall
from agents.ops import telemetry
from tests.helpers import call, final, person, tainted_write
from tests.operations import otlp
from tests.workers.cluster import BASE

pytestmark = pytest.mark.django_db

USAGE = {"input_tokens": 120, "output_tokens": 30}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    telemetry.configure(SimpleSpanProcessor(memory))
    try:
        yield memory
    finally:
        telemetry.reset()


def ids(run: Run) -> tuple[int, int]:
    _, trace_id, span_id, _ = run.trace_context.split("-")
    return int(trace_id, 16), int(span_id, 16)


def named(spans: Any, prefix: str) -> list[Any]:
    return [s for s in spans if s.name.startswith(prefix)]


def approved_run(launch: Callable[..., Run], drive: Callable[..., Run]) -> Run:
    """Reads external text (taint), then a write a reviewer approves, then answers."""
    run = drive(launch([call("fetch_fixture", USAGE, text="planted"), call("ledger_write", USAGE, entry="booked"),
                        final("ok", USAGE)]))
    rita = person("rita", "reviewer")
    approval_decide(approval_id=Approval.objects.get(run=run).pk, user=rita, decision="approve")
    run = drive(run)
    assert run.state == "done", run.error
    return run


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_one_trace_per_run_with_genai_spans_and_airlock_facts(exporter, launch, drive) -> None:
    run = approved_run(launch, drive)
    trace_id, root_id = ids(run)
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {trace_id}

    [root] = named(spans, "invoke_agent ")
    assert root.name == "invoke_agent scripted" and root.context.span_id == root_id and root.parent is None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["airlock.run.id"] == run.pk and root.attributes["airlock.run.state"] == "done"
    assert root.attributes["airlock.run.tainted"] is True
    assert all(s.parent.span_id == root_id for s in spans if s is not root)

    chats = named(spans, "chat ")
    model = run.profile.model_name
    assert [s.name for s in chats] == [f"chat {model}"] * run.transitions.filter(kind="model").count()
    assert len(chats) == 3
    assert all(s.attributes["gen_ai.provider.name"] == "scripted" for s in chats)
    assert all(s.attributes["gen_ai.request.model"] == model for s in chats)
    assert {(s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"]) for s in chats} == {
        (120, 30)
    }

    [fetch] = named(spans, "execute_tool fetch_fixture")
    [write] = named(spans, "execute_tool ledger_write")
    assert fetch.attributes["gen_ai.tool.name"] == "fetch_fixture"
    assert fetch.attributes["gen_ai.tool.call.id"] == ToolCall.objects.get(run=run, tool="fetch_fixture").idempotency_key
    assert fetch.attributes["airlock.policy.verdict"] == "allow" and fetch.attributes["airlock.taint.source"] is True
    approval = Approval.objects.get(run=run)
    assert write.attributes["gen_ai.tool.call.id"] == approval.idempotency_key
    assert write.attributes["airlock.policy.verdict"] == "ask"
    assert write.attributes["airlock.policy.reason"] == "ledger_write writes and the run has read external content"
    assert write.attributes["airlock.approval.id"] == approval.pk
    assert write.attributes["airlock.approval.decided_by"] == "rita"
    assert write.attributes["airlock.run.tainted"] is True
    # No content unless asked for.
    exported = {key for s in spans for key in s.attributes}
    assert not exported & {"gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.output.messages",
                           "airlock.run.answer"}
    assert not any("planted" in str(v) or "booked" in str(v) for s in spans for v in s.attributes.values())


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
@override_settings(AIRLOCK_OTEL_CAPTURE_CONTENT=True)
def test_content_is_exported_only_when_asked(exporter, launch, drive) -> None:
    run = approved_run(launch, drive)
    spans = exporter.get_finished_spans()
    [write] = named(spans, "execute_tool ledger_write")
    assert "booked" in write.attributes["gen_ai.tool.call.arguments"]
    assert "gen_ai.tool.call.result" in write.attributes
    assert any("gen_ai.output.messages" in s.attributes for s in named(spans, "chat "))
    [root] = named(spans, "invoke_agent ")
    assert root.attributes["airlock.run.answer"] == run.answer


def test_denied_and_rejected_calls_are_tool_spans_that_did_not_execute(exporter, launch, drive) -> None:
    denied = drive(launch(tainted_write(), approver="none"))
    asked = drive(launch(tainted_write()))
    rob = person("rob", "reviewer")
    approval_decide(approval_id=Approval.objects.get(run=asked).pk, user=rob, decision="reject", note="no")
    asked = drive(asked)
    spans = exporter.get_finished_spans()

    def writes(run: Run) -> list[Any]:
        return [s for s in named(spans, "execute_tool ledger_write") if s.context.trace_id == ids(run)[0]]

    [deny] = writes(denied)
    assert deny.attributes["airlock.policy.verdict"] == "deny" and deny.attributes["airlock.tool.executed"] is False
    assert deny.attributes["airlock.policy.reason"].endswith("and the run has no approver")
    [reject] = writes(asked)
    assert reject.attributes["airlock.tool.executed"] is False
    assert reject.attributes["airlock.approval.decision"] == "reject"
    assert reject.attributes["airlock.approval.decided_by"] == "rob"
    assert reject.status.status_code.name == "ERROR"


def test_a_failed_run_says_why_on_its_root_span(exporter, launch, drive) -> None:
    run = drive(launch([call("echo", text="once")]))
    [root] = named(exporter.get_finished_spans(), "invoke_agent ")
    assert run.state == "failed" and root.attributes["airlock.run.reason_kind"] == "script_exhausted"
    assert root.status.status_code.name == "ERROR"


@pytest.mark.process
def test_tracing_off_costs_nothing(launch, drive) -> None:
    assert not telemetry.enabled()
    run = drive(launch([call("echo", text="hi"), final()]))
    assert run.state == "done" and run.trace_context == ""
    probe = (
        "import django, sys; django.setup(); import agents.runs.store, agents.actions.runs, agents.actions.approvals, agents.tasks, agents.ops.operations;"
        " print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {"DJANGO_SETTINGS_MODULE": "config.settings", "PATH": "/usr/bin:/bin", "AIRLOCK_VAR_DIR": str(BASE / "var")}
    done = subprocess.run([sys.executable, "-c", probe], cwd=BASE, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def receiver() -> Iterator[otlp.Receiver]:
    yield from otlp.serve()


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_spans_reach_a_collector_through_the_real_otlp_http_exporter(receiver, launch, drive, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "airlock-test")
    with override_settings(AIRLOCK_OTEL=True):
        try:
            run = approved_run(launch, drive)
            assert telemetry._provider is not None and telemetry._provider.force_flush(10_000)
        finally:
            telemetry.reset()
    trace_id = f"{ids(run)[0]:032x}"
    spans = receiver.of_trace(trace_id)
    assert receiver.requests >= 1
    assert sorted(s.name for s in spans) == sorted(
        ["invoke_agent scripted", *[f"chat {run.profile.model_name}"] * 3,
         "execute_tool fetch_fixture", "execute_tool ledger_write"]
    )
    [root] = [s for s in spans if s.name.startswith("invoke_agent")]
    assert root.span_id == f"{ids(run)[1]:016x}" and root.parent_span_id == ""
    assert all(s.parent_span_id == root.span_id for s in spans if s is not root)
    assert root.resource["service.name"] == "airlock-test"
    [write] = [s for s in spans if s.name == "execute_tool ledger_write"]
    assert write.attributes["airlock.approval.decided_by"] == "rita"
    assert write.attributes["gen_ai.tool.call.id"] == Approval.objects.get(run=run).idempotency_key
