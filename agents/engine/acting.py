"""A step in `acting`: the tool's turn. The journal says whether the call already ran;
otherwise the tool runs (or a client reports its result) and the result is recorded.
"""

from __future__ import annotations

from typing import Any

from .protocols import Deps, ToolOutcome
from .registry import ToolContext, ToolSpec
from .run import OUTCOME_UNKNOWN, Move, Outcome, RunState, approval_row, call_args, move_to
from .states import ACTING, AWAITING_APPROVAL, PLANNING
from .transcript import tool_message


def run_tool(state: RunState, deps: Deps) -> Outcome | None:
    call = state.current_call
    assert call is not None, "acting without a current call"
    spec = deps.registry.get(call["tool"])
    entry = deps.journal.get(call["key"])
    if entry is not None and entry.status in ("succeeded", "failed"):
        # Nothing runs twice: the journal already holds this call's result.
        return _record(state, call, spec, ToolOutcome(ok=True), stored=entry.result)
    reuse = call.get("reuse")
    if reuse is not None:
        # A fork reusing its parent's result: the tool is not called.
        recorded = deps.journal.get(reuse["key"])
        if recorded is None or recorded.status != "succeeded":
            gone = f"the recorded result of run #{reuse.get('run')} step {reuse.get('seq')} is no longer in the journal"
            result = {"ok": False, "error": "reuse_unavailable", "detail": gone}
        else:
            result = recorded.result
        return _record(state, call, spec, ToolOutcome(ok=True), stored=result, reused=reuse)
    if spec is None:
        outcome = ToolOutcome(ok=False, error="unknown_tool", detail=f"{call['tool']} is no longer registered")
        return _record(state, call, spec, outcome)
    if spec.client:
        return None  # the client runs it and reports the result (`report`): nothing to do here
    if entry is not None and entry.status == "started" and spec.retry_safety == "unsafe":
        # An earlier attempt began and never recorded a result: it may have happened.
        return _outcome_unknown(state, call, spec, f"{call['tool']} was interrupted")
    if spec.retry_safety == "unsafe" and not deps.journal.begin(call["key"]):
        return None  # another worker started it between our read and our mark
    ctx = ToolContext(run_id=state.run_id, idempotency_key=call["key"], timeout=spec.timeout)
    args = call_args(state, call)
    outcome = deps.runner.run(spec, args, ctx)
    if outcome.unknown and spec.retry_safety == "unsafe":
        # The tool failed after its request left (a server died mid-call): the journal
        # entry stays `started`, exactly as after a crash of our own.
        return _outcome_unknown(state, call, spec, f"{call['tool']} failed mid-call ({outcome.detail})")
    return _record(state, call, spec, outcome)


def report(state: RunState, spec: ToolSpec | None, outcome: ToolOutcome) -> Outcome:
    """The client's result of the client tool the run is acting on: recorded as if a
    tool runner had returned it (acting -> planning, the journal's result, taint)."""
    call = state.current_call
    if state.state != ACTING or not call or not call.get("client"):
        raise ValueError("the run is not waiting for a client tool's result")
    return _record(state, call, spec, outcome)


def _outcome_unknown(state: RunState, call: dict[str, Any], spec: ToolSpec, why: str) -> Outcome:
    new = state.copy()
    reason = f"{OUTCOME_UNKNOWN}: {why} and is not safe to repeat"
    new.approval = {"kind": "outcome_unknown", "reason": reason}
    t = Move(ACTING, AWAITING_APPROVAL, "outcome_unknown", {"call": {"id": call["id"], "tool": call["tool"]}, "reason": reason})
    t.approval = approval_row(new, call, call_args(state, call), "outcome_unknown", reason, spec)
    return move_to(new, AWAITING_APPROVAL, t)


def _record(
    state: RunState,
    call: dict[str, Any],
    spec: ToolSpec | None,
    outcome: ToolOutcome,
    stored: Any = None,
    reused: dict[str, Any] | None = None,
) -> Outcome:
    result = stored if stored is not None else outcome.result()
    ok = bool(isinstance(result, dict) and result.get("ok"))
    new = state.copy()
    new.steps += 1
    new.current_call = None
    detail: dict[str, Any] = {"call": {"id": call["id"], "tool": call["tool"]}, "ok": ok}
    if ok:
        new.consecutive_errors = 0
        new.error_streak = None
    else:
        new.consecutive_errors += 1
        error = result.get("error") if isinstance(result, dict) else "error"
        detail["error"] = error
        streak = new.error_streak or {}
        same = streak.get("fp") == call["fp"] and streak.get("error") == error
        new.error_streak = {"fp": call["fp"], "error": error, "count": streak.get("count", 0) + 1 if same else 1}
    if reused is not None:
        detail["reused"] = {"run": reused.get("run"), "seq": reused.get("seq")}
    elif stored is not None:
        detail["replayed"] = True
    if spec is not None and spec.returns == "external" and not new.tainted:
        new.tainted = True
        new.taint_source = {"call_id": call["id"], "tool": call["tool"], "key": call["key"], "step": state.steps}
        detail["tainted"] = True
    t = Move(ACTING, PLANNING, "tool", detail, duration_ms=outcome.duration_ms)
    t.messages.append(tool_message(call, result))
    if stored is None or reused is not None:
        t.journal_result = {"key": call["key"], "fp": call["fp"], "status": "succeeded" if ok else "failed", "result": result}
    return move_to(new, PLANNING, t)
