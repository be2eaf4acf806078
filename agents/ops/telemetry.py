"""OpenTelemetry traces of runs, following the GenAI semantic conventions where they fit.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set; the standard
OTEL_* variables configure the OTLP/HTTP exporter. Disabled, a commit pays one check
and nothing of OpenTelemetry is imported.

One trace per run. Its context is a W3C traceparent stored on the run at launch
(`Run.trace_context`), so whichever process commits a transition (a worker, another
worker after a crash, the web server deciding an approval, the sweeper) adds its span to
the same trace. Spans are made from committed transitions, in `store.commit`:

- `chat {model}` for each model call (its recorded duration),
- `execute_tool {tool}` for each tool call, and for a call policy denied or a reviewer
  rejected (not executed),
- `invoke_agent {profile}` for the run itself, once it ends: from launch to the end,
  with the span id the traceparent named at launch, so every other span is its child.

Arguments, results and replies are exported only with AIRLOCK_OTEL_CAPTURE_CONTENT=1.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.conf import settings

from agents.engine import states
from agents.engine.step import proposed_call
from agents.models import Approval, Transition
from agents.ops.metrics import reason_kind

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Tracer

    from agents.engine.run import Move, RunState
    from agents.models import Run

log = logging.getLogger("airlock.telemetry")

_provider: TracerProvider | None = None
_configuring = threading.Lock()
# The ids the next root span must take: the ones the run's traceparent named at launch.
_fixed_ids: ContextVar[tuple[int, int] | None] = ContextVar("airlock_fixed_ids", default=None)


def enabled() -> bool:
    return _provider is not None or bool(settings.AIRLOCK_OTEL)


def configure(*processors: SpanProcessor) -> TracerProvider:
    """A tracer provider exporting through `processors` (the OTLP exporter by default)."""
    global _provider
    # Late: the OpenTelemetry SDK loads only in a process that traces (AIRLOCK_OTEL).
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            fixed = _fixed_ids.get()
            return fixed[0] if fixed else super().generate_trace_id()

        def generate_span_id(self) -> int:
            fixed = _fixed_ids.get()
            return fixed[1] if fixed else super().generate_span_id()

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "airlock"}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=RunIds())
    if not processors:
        # Late: the OpenTelemetry SDK loads only in a process that traces (AIRLOCK_OTEL).
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        processors = (BatchSpanProcessor(OTLPSpanExporter()),)
    for processor in processors:
        provider.add_span_processor(processor)
    _provider = provider
    return provider


def reset() -> None:
    """Forget the provider (tests); the next use configures from the environment."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
    _provider = None


def _tracer() -> Tracer:
    provider = _provider
    if provider is None:
        # A threaded worker's first runs may all get here at once: one provider (and
        # one exporter thread) per process, not one per thread.
        with _configuring:
            provider = _provider if _provider is not None else configure()
    return provider.get_tracer("airlock")


def new_trace_context() -> str:
    """A fresh traceparent for a run being launched ("" with tracing off)."""
    if not enabled():
        return ""
    trace_id = random.getrandbits(128) or 1
    span_id = random.getrandbits(64) or 1
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def _ids(traceparent: str) -> tuple[int, int] | None:
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def transition_committed(run: Run, before: RunState, after: RunState, t: Move) -> None:
    """The spans of one committed transition. A tracing problem never fails a run."""
    ids = _ids(run.trace_context)
    if ids is None:
        return  # launched while tracing was off
    try:
        _spans(run, ids, before, after, t)
    except Exception:  # noqa: BLE001 - telemetry must not break the commit that already happened
        log.warning("could not record spans of run=%s", run.pk, exc_info=True)


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _spans(run: Run, ids: tuple[int, int], before: RunState, after: RunState, t: Move) -> None:
    # Late: the OpenTelemetry SDK loads only in a process that traces (AIRLOCK_OTEL).
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
    from opentelemetry.trace import set_span_in_context as in_context

    tracer = _tracer()
    parent = in_context(NonRecordingSpan(SpanContext(ids[0], ids[1], is_remote=True, trace_flags=TraceFlags(1))))
    profile = run.profile
    model = profile.model_name or profile.provider
    end = time.time()
    common = {"gen_ai.provider.name": profile.provider, "airlock.run.id": run.pk}
    capture = settings.AIRLOCK_OTEL_CAPTURE_CONTENT

    def span(name: str, attributes: dict[str, Any], duration_ms: int, error: str | None = None) -> None:
        s = tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL, start_time=_ns(end - duration_ms / 1000),
                              attributes={k: v for k, v in {**common, **attributes}.items() if v is not None})
        if error:
            s.set_status(Status(StatusCode.ERROR, error))
        s.end(end_time=_ns(end))

    verdict = t.detail.get("verdict") or {}
    if t.kind == "model":
        usage = t.detail.get("usage") or {}
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": usage.get("input_tokens"), "gen_ai.usage.output_tokens": usage.get("output_tokens"),
            "airlock.cost_micros": t.cost_micros, "airlock.model.decision": t.detail.get("decision"),
        }
        if capture:
            attributes["gen_ai.output.messages"] = json.dumps(t.messages, ensure_ascii=False, default=str)
        span(f"chat {model}", attributes, t.duration_ms)
    if t.kind == "tool" and before.current_call is not None:
        _tool_span(span, run, before, after, t, before.current_call, capture)
    elif verdict.get("action") == "deny" and "call" in t.detail:
        call = t.detail["call"]
        span(f"execute_tool {call['tool']}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["tool"], **_policy(verdict),
            "airlock.tool.executed": False,
        }, 0, "not_permitted")
    elif t.kind == "decision" and t.detail.get("decision") == "reject" and before.current_call is not None:
        call = before.current_call
        approval = _approval(run, call["key"])
        span(f"execute_tool {call['tool']}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["tool"], "gen_ai.tool.call.id": call["key"],
            "airlock.tool.executed": False, **approval,
        }, 0, "rejected")
    if after.state in states.TERMINAL:
        _root_span(tracer, run, ids, after, end, capture)


def _approval(run: Run, key: str) -> dict[str, Any]:
    row = (
        Approval.objects.filter(run_id=run.pk, idempotency_key=key)
        .exclude(decision="")
        .order_by("-pk")
        .values("pk", "decision", "decided_by__username")
        .first()
    )
    if row is None:
        return {}
    return {"airlock.approval.id": row["pk"], "airlock.approval.decision": row["decision"],
            "airlock.approval.decided_by": row["decided_by__username"]}


def _verdict(run: Run, call_id: str) -> dict[str, Any]:
    """The policy verdict of the transition that proposed this call."""
    verdict = (
        Transition.objects.filter(run_id=run.pk, payload__call__id=call_id, payload__has_key="verdict")
        .order_by("-seq")
        .values_list("payload__verdict", flat=True)
        .first()
    )
    return _policy(verdict) if isinstance(verdict, dict) else {}


def _policy(verdict: dict[str, Any]) -> dict[str, Any]:
    """A verdict as airlock.policy.* attributes: its action as `verdict`, every other
    plain field (the reason, a rule's name) under its own name."""
    attributes = {"airlock.policy.verdict": verdict.get("action")}
    for key, value in verdict.items():
        if key != "action" and isinstance(value, (str, int, float, bool)):
            attributes[f"airlock.policy.{key}"] = value
    return attributes


def _tool_span(span: Any, run: Run, before: RunState, after: RunState, t: Move, call: dict[str, Any],
               capture: bool) -> None:
    ok = bool(t.detail.get("ok"))
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["tool"], "gen_ai.tool.call.id": call["key"],
        "airlock.tool.call_id": call["id"], "airlock.tool.ok": ok, "airlock.tool.error": t.detail.get("error"),
        "airlock.tool.replayed": bool(t.detail.get("replayed")), "airlock.run.tainted": after.tainted,
        "airlock.taint.source": bool(t.detail.get("tainted")),
        **_verdict(run, call["id"]), **_approval(run, call["key"]),
    }
    if capture:
        attributes["gen_ai.tool.call.arguments"] = json.dumps(proposed_call(before, call["id"])["args"], default=str)
        if t.journal_result is not None:
            attributes["gen_ai.tool.call.result"] = json.dumps(t.journal_result["result"], default=str)
    span(f"execute_tool {call['tool']}", attributes, t.duration_ms, None if ok else str(t.detail.get("error")))


def _root_span(tracer: Tracer, run: Run, ids: tuple[int, int], after: RunState, end: float, capture: bool) -> None:
    # Late: the OpenTelemetry SDK loads only in a process that traces (AIRLOCK_OTEL).
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode

    profile = run.profile
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": profile.name,
        "gen_ai.provider.name": profile.provider, "gen_ai.request.model": profile.model_name or profile.provider,
        "airlock.run.id": run.pk, "airlock.run.state": after.state, "airlock.run.steps": after.steps,
        "airlock.run.tainted": after.tainted, "airlock.run.cost_micros": after.cost_micros,
        "airlock.run.cost_unknown": after.cost_unknown, "airlock.run.tokens": after.tokens,
    }
    if after.state == states.FAILED:
        attributes["airlock.run.reason_kind"] = reason_kind(after.error)
    if capture and after.answer is not None:
        attributes["airlock.run.answer"] = after.answer
    token = _fixed_ids.set(ids)
    try:
        root = tracer.start_span(
            f"invoke_agent {profile.name}", context=Context(), kind=SpanKind.INTERNAL,
            start_time=_ns(run.created_at.timestamp()), attributes=attributes,
        )
    finally:
        _fixed_ids.reset(token)
    if after.state != states.DONE:
        root.set_status(Status(StatusCode.ERROR, after.error or after.state))
    root.end(end_time=_ns(end))
