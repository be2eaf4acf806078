"""step(): advance a run by exactly one transition.

The engine never continues on its own: the driver persists every transition before it
asks for the next one. A step returns the new state and a `Transition` describing what
to write (the transition row, appended messages, journal and approval effects), or None
when the run rests (terminal, or waiting for a human).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, fields
from typing import Any

from . import context, patch, policy
from . import limits as limits_mod
from .fingerprints import fingerprint, idempotency_key
from .protocols import Decision, Deps, ModelError, ModelRequest, ToolOutcome
from .registry import ToolContext, ToolSpec
from .states import (
    ACTING,
    AWAITING_APPROVAL,
    CANCELLED,
    DONE,
    FAILED,
    PLANNING,
    QUEUED,
    TERMINAL,
    check_edge,
)

TRANSCRIPT_CAP = 8_000
OUTCOME_UNKNOWN = "outcome unknown"


@dataclass
class RunState:
    """Everything the engine knows about a run, as plain JSON-able data."""

    run_id: str
    state: str = QUEUED
    steps: int = 0
    model_calls: int = 0
    cost_micros: int = 0
    cost_unknown: bool = False
    tokens: int = 0
    consecutive_errors: int = 0
    tainted: bool = False
    taint_source: dict[str, Any] | None = None
    deadline: float = 0.0
    approver: str = "human"
    limits: dict[str, int] = field(default_factory=dict)
    # Snapshot of the profile at launch, so a run replays the same whatever edits follow.
    tools: list[str] | None = None
    denied_tools: list[str] = field(default_factory=list)
    always_ask_tools: list[str] = field(default_factory=list)
    prices: dict[str, int] = field(default_factory=dict)
    # The policy at launch: rules (launch rules first), irreversible_approvals,
    # separate_duties, approval_timeout_seconds, on_expiry (see policy.snapshot).
    policy: dict[str, Any] = field(default_factory=dict)
    # Run-scoped grants, numbered from 1: {"n", "tool", "fp"? (one exact call), "by",
    # "revoked"?}. A revoked grant stays listed so numbers are never reused.
    grants: list[dict[str, Any]] = field(default_factory=list)
    # Calls are referred to by id; their arguments live once, in the assistant message
    # that proposed them, so the state (rewritten every step) stays the same size.
    pending_calls: list[str] = field(default_factory=list)
    current_call: dict[str, Any] | None = None  # {"id", "tool", "key", "fp"}
    approval: dict[str, Any] | None = None
    error_streak: dict[str, Any] | None = None
    answer: str | None = None
    error: str | None = None
    # Context management (engine/context.py); None when the run has no budget.
    context_tokens: int | None = None
    folded_before: int | None = None
    token_scale: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    def engine_json(self) -> dict[str, Any]:
        """The state without the transcript (stored as message rows), nulls dropped."""
        # Not asdict(): it would deep-copy the whole transcript on every step.
        return patch.compact(self._fields())  # type: ignore[no-any-return]

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _STATE_FIELDS}

    @classmethod
    def from_json(cls, data: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> RunState:
        state = cls(**{k: v for k, v in data.items() if k in _STATE_FIELDS})
        state.messages = list(messages or [])
        return state

    def copy(self) -> RunState:
        # A JSON round trip is the fastest deep copy of plain data; the transcript is
        # shared (messages are only ever appended, never changed in place).
        state = RunState(**json.loads(json.dumps(self._fields())))
        state.messages = list(self.messages)
        return state


@dataclass
class Transition:
    from_state: str
    to_state: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)
    cost_micros: int = 0
    tokens: int = 0
    duration_ms: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Effects the store applies in the same database transaction as the row itself.
    intent: dict[str, Any] | None = None  # journal row to create, status "intended"
    journal_result: dict[str, Any] | None = None  # {"key", "status", "result"}
    journal_reset: str | None = None  # key to set back to "intended" (run it again)
    approval: dict[str, Any] | None = None  # approval row to create
    approval_close: str | None = None  # status for the run's pending approval
    grant: dict[str, Any] | None = None  # grant record to create {"n", "tool", "args", ...}
    grant_revoke: int | None = None  # number of the grant to mark revoked



Outcome = tuple[RunState, Transition]
# Computed once: dataclasses.fields() is slow enough to show in a profile per step.
_STATE_FIELDS = frozenset(f.name for f in fields(RunState)) - {"messages"}


def new_run(
    run_id: str,
    *,
    limits: limits_mod.Limits,
    now: float,
    approver: str = "human",
    tools: list[str] | None = None,
    denied_tools: list[str] | None = None,
    always_ask_tools: list[str] | None = None,
    prices: dict[str, int] | None = None,
    system_prompt: str = "",
    policy: dict[str, Any] | None = None,
    task: str,
    context_tokens: int | None = None,
) -> RunState:
    if approver not in ("human", "none"):
        raise ValueError(f"approver must be 'human' or 'none', not {approver!r}")
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": task})
    return RunState(
        run_id=str(run_id),
        deadline=now + limits.deadline_seconds,
        approver=approver,
        limits=limits.to_dict(),
        context_tokens=context_tokens or None,
        tools=list(tools) if tools is not None else None,
        denied_tools=list(denied_tools or []),
        always_ask_tools=list(always_ask_tools or []),
        prices=dict(prices or {}),
        policy=dict(policy or {}),
        messages=messages,
    )


def step(state: RunState, deps: Deps) -> Outcome | None:
    """Advance one transition, or return None when the run rests."""
    if state.state in TERMINAL:
        return None
    if state.state == QUEUED:
        return _move(state.copy(), PLANNING, Transition(QUEUED, PLANNING, "pickup"))
    now = deps.now()
    if state.state == AWAITING_APPROVAL:
        # Only the clock moves a waiting run; decisions arrive through decide().
        if state.deadline and now >= state.deadline:
            return fail(state, limits_mod.exceeded(state, now) or "deadline passed")
        return None
    reason = limits_mod.exceeded(state, now)
    if reason:
        return fail(state, reason)
    if state.state == PLANNING:
        if state.pending_calls:
            new = state.copy()
            call = proposed_call(new, new.pending_calls.pop(0))
            return _propose(new, call, deps, Transition(PLANNING, PLANNING, "call"))
        if state.context_tokens:
            compacted = _compact(state, deps)
            if compacted is not None:
                return compacted
        return _call_model(state, deps)
    assert state.state == ACTING
    return _run_tool(state, deps)


def fail(state: RunState, reason: str, *, kind: str = "fail", actor_state: str = FAILED) -> Outcome:
    new = state.copy()
    new.error = reason
    new.pending_calls = []
    new.current_call = None
    new.approval = None
    transition = Transition(state.state, actor_state, kind, {"reason": reason})
    if state.state == AWAITING_APPROVAL:
        transition.approval_close = "expired"
    return _move(new, actor_state, transition)


def cancel(state: RunState, reason: str) -> Outcome:
    return fail(state, reason, kind="cancel", actor_state=CANCELLED)


def decide(state: RunState, decision: str, note: str = "", by: str = "", remember: str | None = None) -> Outcome:
    """A reviewer's answer to the run's pending approval.

    Policy approvals take `approve` or `reject`; "outcome unknown" approvals take
    `happened` (the note becomes the result), `retry` (run the exact call again) or
    `fail` (end the run). `remember` ("call" or "tool") with `approve` also grants the
    same call, or any call of the tool, for the rest of the run.
    """
    if state.state != AWAITING_APPROVAL or not state.approval or not state.current_call:
        raise ValueError("the run is not waiting for a decision")
    kind = state.approval["kind"]
    allowed = ("approve", "reject") if kind == "policy" else ("happened", "retry", "fail")
    if decision not in allowed:
        raise ValueError(f"a {kind} approval takes {' or '.join(allowed)}, not {decision!r}")
    if remember is not None and (remember not in ("call", "tool") or decision != "approve"):
        raise ValueError("remember takes 'call' or 'tool', and only with approve")
    call = state.current_call
    new = state.copy()
    new.approval = None
    detail: dict[str, Any] = {"decision": decision, "by": by, "note": note, "call_id": call["id"], "tool": call["tool"]}
    if remember is not None:
        grant: dict[str, Any] = {"n": len(new.grants) + 1, "tool": call["tool"], "by": by}
        if remember == "call":
            grant["fp"] = call["fp"]
        new.grants = [*new.grants, grant]
        detail["grant"] = {**grant, "args": proposed_call(state, call["id"])["args"] if remember == "call" else None}
    grant_effect = detail.get("grant")
    if decision == "fail":
        return fail(state, f"failed by {by or 'a reviewer'} after {OUTCOME_UNKNOWN}: {note}".rstrip(": "))
    if decision in ("approve", "retry"):
        t = Transition(AWAITING_APPROVAL, ACTING, "decision", detail)
        if decision == "approve":
            t.intent = _intent(new, call, proposed_call(state, call["id"])["args"])
            t.grant = grant_effect
        else:
            t.journal_reset = call["key"]
        return _move(new, ACTING, t)
    new.current_call = None
    t = Transition(AWAITING_APPROVAL, PLANNING, "decision", detail)
    if decision == "reject":
        reason = f"rejected by a human reviewer{f' ({by})' if by else ''}"
        result = policy.not_permitted(f"{reason}: {note}" if note else reason)
    else:  # happened: the reviewer's note stands in for the lost result
        result = {"ok": True, "result": note or "the reviewer confirmed it happened"}
        t.journal_result = {"key": call["key"], "fp": call["fp"], "status": "succeeded", "result": result}
        new.steps += 1
        new.consecutive_errors = 0
    t.messages.append(_tool_message(call, result))
    return _move(new, PLANNING, t)


def revoke_grant(state: RunState, n: int, by: str = "") -> Outcome:
    """End a run-scoped grant: calls it covered ask again from the next proposal on.

    A transition that changes no state (from == to): it records who revoked what
    and when, without being an edge of the machine.
    """
    if state.state in TERMINAL:
        raise ValueError("the run has ended")
    grant = next((g for g in state.grants if g["n"] == n), None)
    if grant is None or grant.get("revoked"):
        raise LookupError(f"no active grant {n}")
    new = state.copy()
    new.grants = [{**g, "revoked": True} if g["n"] == n else g for g in new.grants]
    t = Transition(state.state, state.state, "revoke", {"grant": {"n": n, "tool": grant["tool"]}, "by": by})
    t.grant_revoke = n
    return new, t


# -- planning ------------------------------------------------------------------------


def _compact(state: RunState, deps: Deps) -> Outcome | None:
    """Fold older tool results out of the prompt when it would exceed the budget."""
    assert state.context_tokens
    try:
        plan = context.plan(
            state.messages, _offered(state, deps), budget=state.context_tokens,
            folded_before=state.folded_before or 0, scale=state.token_scale,
        )
    except context.OverBudget as exc:
        return fail(state, (
            f"context budget: the prompt needs about {exc.tokens} tokens with every older tool result "
            f"folded, over context_tokens {state.context_tokens}"
        ))
    if plan is None:
        return None
    new = state.copy()
    new.folded_before = plan.folded_before
    detail = {
        "folded": plan.folded, "tokens_before": plan.tokens_before, "tokens_after": plan.tokens_after,
        "budget": state.context_tokens,
    }
    return _move(new, PLANNING, Transition(PLANNING, PLANNING, "compact", detail))


def _call_model(state: RunState, deps: Deps) -> Outcome:
    specs = _offered(state, deps)
    started = time.monotonic()
    prompt = context.prompt(state.messages, state.folded_before or 0)
    request = ModelRequest(run_id=state.run_id, turn=state.model_calls, messages=prompt, tools=specs)
    try:
        decision = deps.model.decide(request)
    except ModelError as exc:
        return fail(state, f"model error: {exc}")
    duration = int((time.monotonic() - started) * 1000)
    new = state.copy()
    new.steps += 1
    new.model_calls += 1
    cost, tokens = _account(new, decision)
    if new.context_tokens and decision.usage is not None:
        new.token_scale = context.corrected_scale(decision.usage.input_tokens, context.raw_tokens(prompt, specs))
    calls, renamed = unique_calls(decision, state.model_calls)
    message: dict[str, Any] = {"role": "assistant", "content": decision.final or decision.text}
    if calls:
        message["tool_calls"] = calls
    detail: dict[str, Any] = {"decision": "final" if decision.final is not None else "calls"}
    detail["usage"] = None if decision.usage is None else decision.usage.to_dict()
    if renamed:
        detail["renamed_ids"] = renamed
    if decision.final is not None:
        new.answer = decision.final
        t = Transition(PLANNING, DONE, "model", detail, cost, tokens, duration, [message])
        return _move(new, DONE, t)
    detail["calls"] = len(calls)
    t = Transition(PLANNING, PLANNING, "model", detail, cost, tokens, duration, [message])
    new.pending_calls = [c["id"] for c in calls[1:]]
    return _propose(new, calls[0], deps, t)


def unique_calls(decision: Decision, turn: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The reply's calls with ids unique within it, and {new id: id the model gave}.

    Some OpenAI-compatible servers give several calls of one reply the same id; calls
    are found by id, so the second would be lost and the first run twice. The renamed
    id is what the transcript (and so the provider) sees from then on, for the call and
    its result alike, which keeps every call paired with its own result.
    """
    calls: list[dict[str, Any]] = []
    renamed: dict[str, str] = {}
    taken: set[str] = set()
    for i, c in enumerate(decision.calls):
        given = c.id or f"call_{turn}_{i}"
        call_id, n = given, 1
        while call_id in taken:
            n += 1
            call_id = f"{given}_{n}"
        if call_id != given:
            renamed[call_id] = given
        taken.add(call_id)
        calls.append({"id": call_id, "tool": c.tool, "args": c.args})
    return calls, renamed


def _account(new: RunState, decision: Decision) -> tuple[int, int]:
    """Tokens and cost of a model call. Cached prompt tokens are priced at the
    profile's cached-input price and cache writes at its cache-write price; a run
    whose prices lack those keys pays the input price for them."""
    usage = decision.usage
    if usage is None:
        new.cost_unknown = True
        return 0, 0
    tokens = usage.input_tokens + usage.output_tokens
    price_in = new.prices.get("input", 0)
    uncached = max(0, usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens)
    cost = math.ceil(
        (
            uncached * price_in
            + usage.cached_input_tokens * new.prices.get("cached_input", price_in)
            + usage.cache_write_tokens * new.prices.get("cache_write", price_in)
            + usage.output_tokens * new.prices.get("output", 0)
        )
        / 1_000_000
    )
    new.tokens += tokens
    new.cost_micros += cost
    return cost, tokens


def _offered(state: RunState, deps: Deps) -> list[ToolSpec]:
    return list(deps.registry.subset(state.tools))


def _propose(new: RunState, call: dict[str, Any], deps: Deps, t: Transition) -> Outcome:
    """Validate, check repeats, apply policy: one proposed call, one transition."""
    tool, args = call["tool"], call["args"]
    spec = deps.registry.get(tool) if (new.tools is None or tool in new.tools) else None
    t.detail["call"] = {"id": call["id"], "tool": tool}
    invalid = None
    if spec is None:
        offered = ", ".join(s.name for s in _offered(new, deps)) or "none"
        invalid = {"ok": False, "error": "unknown_tool", "detail": f"no tool named {tool!r}; available: {offered}"}
    elif (problem := spec.validate(args)) is not None:
        invalid = {"ok": False, "error": "invalid_arguments", "detail": problem}
    if invalid is not None:
        new.consecutive_errors += 1
        t.detail["invalid"] = invalid
        t.messages.append(_tool_message(call, invalid))
        t.to_state = PLANNING
        return _move(new, PLANNING, t)
    assert spec is not None
    fp = fingerprint(tool, args)
    lim = limits_mod.Limits.from_dict(new.limits)
    times = deps.journal.executed(fp)
    streak = new.error_streak or {}
    if times >= lim.max_identical_calls:
        reason = (
            f"repeated identical call: {tool} with the same arguments already ran "
            f"{times} time(s) (max_identical_calls {lim.max_identical_calls})"
        )
        return _fail_from(new, t, reason)
    if streak.get("fp") == fp and streak.get("count", 0) >= limits_mod.IDENTICAL_ERROR_STREAK:
        reason = (
            f"repeated identical call: {tool} failed {streak['count']} times in a row "
            f"with the same error ({streak.get('error')})"
        )
        return _fail_from(new, t, reason)
    verdict = policy.decide(
        spec,
        tool,
        denied=new.denied_tools,
        always_ask=new.always_ask_tools,
        tainted=new.tainted,
        approver=new.approver,
        args=args,
        policy=new.policy,
        grants=new.grants,
        fingerprint=fp,
    )
    t.detail["verdict"] = verdict.to_dict()
    current = {"id": call["id"], "tool": tool, "key": idempotency_key(new.run_id, new.steps, tool, args), "fp": fp}
    if verdict.action == "allow":
        new.current_call = current
        t.intent = _intent(new, current, args)
        t.to_state = ACTING
        return _move(new, ACTING, t)
    if verdict.action == "ask":
        new.current_call = current
        new.approval = {"kind": "policy", "reason": verdict.reason}
        t.approval = _approval_row(new, current, args, "policy", verdict.reason, spec, verdict)
        t.to_state = AWAITING_APPROVAL
        return _move(new, AWAITING_APPROVAL, t)
    if verdict.no_approver:
        t.approval = {**_approval_row(new, current, args, "policy", verdict.reason, spec, verdict), "status": "denied"}
    t.messages.append(_tool_message(call, policy.not_permitted(verdict.reason)))
    t.to_state = PLANNING
    return _move(new, PLANNING, t)


def _fail_from(new: RunState, t: Transition, reason: str) -> Outcome:
    """Fail inside a transition that already carries a model reply."""
    new.error = reason
    new.pending_calls = []
    new.current_call = None
    t.detail["reason"] = reason
    t.to_state = FAILED
    return _move(new, FAILED, t)


def proposed_call(state: RunState, call_id: str) -> dict[str, Any]:
    """The call with this id as the model proposed it (the newest such message wins)."""
    for message in reversed(state.messages):
        for call in message.get("tool_calls") or ():
            if call["id"] == call_id:
                return {"id": call["id"], "tool": call["tool"], "args": call["args"]}
    raise LookupError(f"no proposed call {call_id!r} in the transcript")


def _intent(state: RunState, call: dict[str, Any], args: Any) -> dict[str, Any]:
    return {
        "key": call["key"], "fp": call["fp"], "call_id": call["id"], "tool": call["tool"], "args": args,
        "step": state.steps,
    }


def _approval_row(
    state: RunState,
    call: dict[str, Any],
    args: Any,
    kind: str,
    reason: str,
    spec: ToolSpec | None,
    verdict: policy.Verdict | None = None,
) -> dict[str, Any]:
    return {
        "rule": verdict.rule if verdict else None,
        "required": verdict.required if verdict else 1,
        "kind": kind,
        "key": call["key"],
        "call_id": call["id"],
        "tool": call["tool"],
        "args": args,
        "risk": spec.risk if spec else "irreversible",
        "reason": reason,
        "taint_source": state.taint_source if state.tainted else None,
        "step": state.steps,
        "status": "pending",
    }


# -- acting --------------------------------------------------------------------------


def _run_tool(state: RunState, deps: Deps) -> Outcome | None:
    call = state.current_call
    assert call is not None, "acting without a current call"
    spec = deps.registry.get(call["tool"])
    entry = deps.journal.get(call["key"])
    if entry is not None and entry.status in ("succeeded", "failed"):
        # Nothing runs twice: the journal already holds this call's result.
        return _record(state, call, spec, ToolOutcome(ok=True), stored=entry.result)
    if spec is None:
        outcome = ToolOutcome(ok=False, error="unknown_tool", detail=f"{call['tool']} is no longer registered")
        return _record(state, call, spec, outcome)
    if entry is not None and entry.status == "started" and spec.retry_safety == "unsafe":
        # An earlier attempt began and never recorded a result: it may have happened.
        new = state.copy()
        reason = f"{OUTCOME_UNKNOWN}: {call['tool']} was interrupted and is not safe to repeat"
        new.approval = {"kind": "outcome_unknown", "reason": reason}
        t = Transition(ACTING, AWAITING_APPROVAL, "outcome_unknown", {"call": {"id": call["id"], "tool": call["tool"]}, "reason": reason})
        t.approval = _approval_row(new, call, proposed_call(state, call["id"])["args"], "outcome_unknown", reason, spec)
        return _move(new, AWAITING_APPROVAL, t)
    if spec.retry_safety == "unsafe" and not deps.journal.begin(call["key"]):
        return None  # another worker started it between our read and our mark
    ctx = ToolContext(run_id=state.run_id, idempotency_key=call["key"], timeout=spec.timeout)
    args = proposed_call(state, call["id"])["args"]
    return _record(state, call, spec, deps.runner.run(spec, args, ctx))


def _record(
    state: RunState,
    call: dict[str, Any],
    spec: ToolSpec | None,
    outcome: ToolOutcome,
    stored: Any = None,
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
    if stored is not None:
        detail["replayed"] = True
    if spec is not None and spec.returns == "external" and not new.tainted:
        new.tainted = True
        new.taint_source = {"call_id": call["id"], "tool": call["tool"], "key": call["key"], "step": state.steps}
        detail["tainted"] = True
    t = Transition(ACTING, PLANNING, "tool", detail, duration_ms=outcome.duration_ms)
    t.messages.append(_tool_message(call, result))
    if stored is None:
        t.journal_result = {"key": call["key"], "fp": call["fp"], "status": "succeeded" if ok else "failed", "result": result}
    return _move(new, PLANNING, t)


def _tool_message(call: dict[str, Any], result: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call["id"], "name": call["tool"], "content": cap(result_text(result))}


def result_text(result: Any) -> str:
    """What the model reads: a success's value (text as is), an error as JSON."""
    if isinstance(result, dict) and result.get("ok") is True and "result" in result:
        value = result["result"]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return json.dumps(result, ensure_ascii=False, default=str)


def cap(text: str, limit: int = TRANSCRIPT_CAP) -> str:
    if len(text) <= limit:
        return text
    return (
        text[:limit]
        + f"\n[airlock: result truncated, {len(text) - limit} more characters; "
        + "the full result is in the tool-call journal]"
    )


def _move(new: RunState, to_state: str, t: Transition) -> Outcome:
    check_edge(t.from_state, to_state)
    new.state = to_state
    new.messages = [*new.messages, *t.messages]
    return new, t
