"""step(): advance a run by exactly one transition.

The engine never continues on its own: the driver persists every transition before it
asks for the next one. A step returns the new state and a `Move` describing what
to write (the transition row, appended messages, journal and approval effects), or None
when the run rests (terminal, or waiting for a human).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NotRequired, TypedDict

from . import context, decisions, patch, policy
from . import limits as limits_mod
from .fingerprints import fingerprint, idempotency_key
from .history import Answer, Figures, History, Query
from .policy import APPROVERS, HUMAN
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
    approver: str = HUMAN
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
    # A fork (docs/retry.md): {"run": parent id, "seq": the fork point, "reuse":
    # "recorded" | "none", "prior": the parent's calls that took effect after the fork
    # point, each {"fp", "key", "tool", "status", "seq", "step", "run"}, dropped once met}.
    fork: dict[str, Any] | None = None
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
        """A new state sharing this one's nested values: a step replaces a nested value
        instead of changing it in place (the engine tests' harness checks every step
        for it). The lists a step changes in place are copied: the queue of pending
        calls it pops, the transcript it appends to."""
        state = object.__new__(RunState)
        state.__dict__.update(self.__dict__)
        state.pending_calls = list(self.pending_calls)
        state.messages = list(self.messages)
        return state


class IntentRow(TypedDict):
    """A journal row to create (status "intended") before a call runs."""

    key: str
    fp: str
    call_id: str
    tool: str
    args: Any
    step: int


class JournalResult(TypedDict):
    """A call's outcome, written to its journal row in the commit that leaves `acting`."""

    key: str
    fp: str
    status: str  # "succeeded" | "failed"
    result: Any


class ApprovalRow(TypedDict):
    """An approval row to create: the exact call shown, why, and its status."""

    rule: dict[str, Any] | None
    required: int
    kind: str
    key: str
    call_id: str
    tool: str
    args: Any
    risk: str
    reason: str
    taint_source: dict[str, Any] | None
    step: int
    status: str
    expires_at: NotRequired[float]
    shadow: NotRequired[list[dict[str, Any]]]  # what shadow rules would have decided
    history: NotRequired[dict[str, Any] | None]  # the deciding rule's history figures
    prior: NotRequired[dict[str, Any]]  # an "already ran" approval: the parent's call


@dataclass
class Move:
    """What one step did: the edge it took, and what the store writes for it (one
    `Transition` row with its messages and effects)."""

    from_state: str
    to_state: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)
    cost_micros: int = 0
    tokens: int = 0
    duration_ms: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Effects the store applies in the same database transaction as the row itself.
    intent: IntentRow | None = None
    journal_result: JournalResult | None = None
    journal_reset: str | None = None  # key to set back to "intended" (run it again)
    approval: ApprovalRow | None = None
    approval_close: str | None = None  # status for the run's pending approval
    grant: dict[str, Any] | None = None  # grant record to create {"n", "tool", "args", ...}
    grant_revoke: int | None = None  # number of the grant to mark revoked
    # The history queries the verdict asked and the figures it was given: the store
    # holds them still true when it commits (or refuses the commit).
    history: list[tuple[Query, Figures]] = field(default_factory=list)


Outcome = tuple[RunState, Move]
# Computed once: dataclasses.fields() is slow enough to show in a profile per step.
_STATE_FIELDS = frozenset(f.name for f in fields(RunState)) - {"messages"}


def new_run(
    run_id: str,
    *,
    limits: limits_mod.Limits,
    now: float,
    approver: str = HUMAN,
    tools: list[str] | None = None,
    denied_tools: list[str] | None = None,
    always_ask_tools: list[str] | None = None,
    prices: dict[str, int] | None = None,
    system_prompt: str = "",
    policy: dict[str, Any] | None = None,
    task: str,
    context_tokens: int | None = None,
) -> RunState:
    if approver not in APPROVERS:
        raise ValueError(f"approver must be one of {APPROVERS}, not {approver!r}")
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
        return _move(state.copy(), PLANNING, Move(QUEUED, PLANNING, "pickup"))
    now = deps.now()
    if state.state == AWAITING_APPROVAL:
        # Only the clock moves a waiting run; decisions arrive through decide().
        if state.deadline and now >= state.deadline:
            return fail(state, limits_mod.exceeded(state, now) or "deadline passed")
        expires_at = (state.approval or {}).get("expires_at")
        if expires_at is not None and now >= expires_at:
            return expire(state)
        return None
    reason = limits_mod.exceeded(state, now)
    if reason:
        return fail(state, reason)
    if state.state == PLANNING:
        if state.pending_calls:
            new = state.copy()
            call = proposed_call(new, new.pending_calls.pop(0))
            return _propose(new, call, deps, Move(PLANNING, PLANNING, "call"))
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
    transition = Move(state.state, actor_state, kind, {"reason": reason})
    if state.state == AWAITING_APPROVAL:
        transition.approval_close = decisions.EXPIRED
        if kind == "expiry":
            transition.detail["on_expiry"] = "fail"
    return _move(new, actor_state, transition)


def cancel(state: RunState, reason: str) -> Outcome:
    return fail(state, reason, kind="cancel", actor_state=CANCELLED)


def expire(state: RunState) -> Outcome:
    """Nobody answered the pending approval in time; the run's `on_expiry` says what
    follows: `reject` tells the model no reviewer answered and lets it go on, `fail`
    ends the run. Either way the approval is `expired`, never `rejected`."""
    if state.state != AWAITING_APPROVAL or not state.approval or not state.current_call:
        raise ValueError("the run is not waiting for a decision")
    reason = f"no reviewer answered within {state.approval.get('timeout_seconds')} s"
    call = state.current_call
    if state.policy.get("on_expiry") == "fail":
        after, t = fail(state, reason, kind="expiry")
        t.detail.update(call_id=call["id"], tool=call["tool"])
        return after, t
    new = state.copy()
    new.approval = None
    new.current_call = None
    detail = {"reason": reason, "on_expiry": "reject", "call_id": call["id"], "tool": call["tool"]}
    t = Move(AWAITING_APPROVAL, PLANNING, "expiry", detail)
    t.approval_close = decisions.EXPIRED
    t.messages.append(_tool_message(call, policy.not_permitted(reason)))
    return _move(new, PLANNING, t)


def apply_decision(
    state: RunState,
    decision: str,
    note: str = "",
    by: str = "",
    remember: str | None = None,
    *,
    edit: dict[str, Any] | None = None,
    votes: list[dict[str, Any]] | None = None,
) -> Outcome:
    """The reviewers' answer to the run's pending approval.

    Policy approvals take `approve` or `reject`; "outcome unknown" approvals take
    `happened` (the note becomes the result), `retry` (run the exact call again) or
    `fail` (end the run). An `approve` with an `edit` (`{"args", "by", "note"}`, checked
    beforehand with `check_edit`) runs the reviewer's arguments under their own
    idempotency key; `votes` are the votes that decided it, kept on the record.
    `remember` ("call" or "tool") with `approve` also grants the same call, or any call
    of the tool, for the rest of the run.
    """
    if state.state != AWAITING_APPROVAL or not state.approval or not state.current_call:
        raise ValueError("the run is not waiting for a decision")
    kind = state.approval["kind"]
    prior = state.approval.get("prior") or {}
    refused = decisions.refusal(
        kind, decision, edits=edit is not None, remember=remember, reusable=prior.get("status") == "succeeded"
    )
    if refused is not None:
        raise ValueError(refused[1])
    call = state.current_call
    new = state.copy()
    new.approval = None
    detail: dict[str, Any] = {"decision": decision, "by": by, "note": note, "call_id": call["id"], "tool": call["tool"]}
    if votes:
        detail["votes"] = votes
    if edit is not None:
        original = call_args(state, call)
        if edit["args"] != original:
            call = new.current_call = edited_call(new, call, original, edit)
            detail["edit"] = {"from": original, "to": edit["args"], "by": edit.get("by", ""),
                              "note": edit.get("note", ""), "key": call["key"]}
    if remember is not None:
        # A grant covers the call that runs: the reviewer's, when they edited it.
        grant: dict[str, Any] = {"n": len(new.grants) + 1, "tool": call["tool"], "by": by}
        if remember == "call":
            grant["fp"] = call["fp"]
        new.grants = [*new.grants, grant]
        detail["grant"] = {**grant, "args": call_args(new, call) if remember == "call" else None}
    grant_effect = detail.get("grant")
    if decision == "fail":
        after, t = fail(state, f"failed by {by or 'a reviewer'} after {OUTCOME_UNKNOWN}: {note}".rstrip(": "))
        t.detail.update(detail)  # a decision like the others, on the record
        return after, t
    if decision == "reuse":
        # Nothing runs: acting records the parent's journal result under this call's key.
        call = new.current_call = {**call, "reuse": prior}
        t = Move(AWAITING_APPROVAL, ACTING, "decision", detail)
        t.intent = _intent(new, call, call_args(new, call))
        return _move(new, ACTING, t)
    if decision in ("approve", "retry"):
        t = Move(AWAITING_APPROVAL, ACTING, "decision", detail)
        if decision == "approve":
            t.intent = _intent(new, call, call_args(new, call))
            t.grant = grant_effect
        else:
            t.journal_reset = call["key"]
        return _move(new, ACTING, t)
    new.current_call = None
    t = Move(AWAITING_APPROVAL, PLANNING, "decision", detail)
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


class EditRefused(ValueError):
    """A reviewer's arguments that cannot replace the call's: a code, a readable
    detail and the HTTP-like status the API answers with."""

    def __init__(self, code: str, detail: Any, status: int) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail, self.status = code, detail, status


def check_edit(state: RunState, spec: ToolSpec | None, args: Any, history: Answer | None = None) -> policy.Verdict:
    """A reviewer's arguments for the pending call, checked as if the model had
    proposed them: the tool's schema, then the run's policy. The tool cannot change.

    Returns the verdict (an `ask` may need more votes than the original); raises
    EditRefused for invalid arguments or a call the policy denies.
    """
    call = state.current_call
    if state.state != AWAITING_APPROVAL or not call or not state.approval:
        raise ValueError("the run is not waiting for a decision")
    if state.approval["kind"] != decisions.POLICY:
        raise EditRefused("invalid_decision", "only a policy approval's arguments can be edited", 400)
    if spec is None:
        raise EditRefused("unknown_tool", f"{call['tool']} is no longer registered", 409)
    problem = spec.validate(args)
    if problem is not None:
        raise EditRefused("invalid_arguments", problem, 400)
    verdict = verdict_for(state, spec, call["tool"], args, fingerprint(call["tool"], args), history)
    if verdict.action == "deny":
        raise EditRefused(
            "denied_by_policy", {"message": f"the edited call is denied: {verdict.reason}", "rule": verdict.rule}, 409
        )
    return verdict


def edited_key(state: RunState, args: Any) -> str:
    """The idempotency key the pending call gets with a reviewer's arguments."""
    assert state.current_call is not None
    return idempotency_key(state.run_id, state.steps, state.current_call["tool"], args)


def edited_call(state: RunState, call: dict[str, Any], original: Any, edit: dict[str, Any]) -> dict[str, Any]:
    """The current call with a reviewer's arguments: a new idempotency key and
    fingerprint from them, and the edit kept so the tool result can say so. The
    proposing assistant message keeps the model's own arguments (the provider's
    transcript must stay what the model sent); the edited ones live here."""
    args = edit["args"]
    return {
        **call,
        "key": edited_key(state, args),
        "fp": fingerprint(call["tool"], args),
        "args": args,
        "edited": {"from": original, "by": edit.get("by", ""), "note": edit.get("note", "")},
    }


def call_args(state: RunState, call: dict[str, Any]) -> Any:
    """The arguments a call runs with: a reviewer's edit, or what the model proposed."""
    if "args" in call:
        return call["args"]
    return proposed_call(state, call["id"])["args"]


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
    t = Move(state.state, state.state, "revoke", {"grant": {"n": n, "tool": grant["tool"]}, "by": by})
    t.grant_revoke = n
    return new, t


def withdraw_votes(state: RunState, *, approval: int, by: str, reason: str, withdrawn: int, needed: int) -> Outcome:
    """Record that `by`'s votes on the waiting call no longer count (they left): a
    transition that changes no state (from == to), like a grant's revocation. `needed`
    is how many approving votes the call still lacks, for the record to say so."""
    if state.state != AWAITING_APPROVAL:
        raise ValueError("only a run waiting for a decision has votes to withdraw")
    votes = "vote" if withdrawn == 1 else "votes"
    more = "vote" if needed == 1 else "votes"
    text = f"{withdrawn} {votes} by {by} withdrawn ({reason}): the call needs {needed} more {more}"
    detail = {"approval": approval, "by": by, "withdrawn": withdrawn, "needed": needed, "reason": text}
    return state.copy(), Move(state.state, state.state, "withdraw", detail)


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
    return _move(new, PLANNING, Move(PLANNING, PLANNING, "compact", detail))


def _call_model(state: RunState, deps: Deps) -> Outcome | None:
    # A client that decides without being shown the tools (an external agent's, whose
    # own code has them) is not sent them: listing them all can mean reading them.
    specs = _offered(state, deps) if getattr(deps.model, "reads_tools", True) else None
    started = time.monotonic()
    prompt = context.prompt(state.messages, state.folded_before or 0)
    request = ModelRequest(run_id=state.run_id, turn=state.model_calls, messages=prompt, tools=specs or [])
    try:
        decision = deps.model.propose(request)
    except ModelError as exc:
        return fail(state, f"model error: {exc}")
    if decision is None:
        return None  # an external agent's client has not proposed anything: the run rests
    duration = int((time.monotonic() - started) * 1000)
    new = state.copy()
    new.steps += 1
    new.model_calls += 1
    cost, tokens = _account(new, decision)
    if new.context_tokens and decision.usage is not None:
        specs = _offered(state, deps) if specs is None else specs
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
        t = Move(PLANNING, DONE, "model", detail, cost, tokens, duration, [message])
        return _move(new, DONE, t)
    detail["calls"] = len(calls)
    t = Move(PLANNING, PLANNING, "model", detail, cost, tokens, duration, [message])
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


def _propose(new: RunState, call: dict[str, Any], deps: Deps, t: Move) -> Outcome:
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
    lim = limits_mod.of_run(new.limits)
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
    verdict = verdict_for(new, spec, tool, args, fp, _recorded(deps.history, t))
    t.detail["verdict"] = verdict.to_dict()
    if verdict.shadow:
        # What the profile's shadow rules would have decided: recorded, deciding nothing.
        t.detail["shadow"] = [dict(s) for s in verdict.shadow]
    current = {"id": call["id"], "tool": tool, "key": idempotency_key(new.run_id, new.steps, tool, args), "fp": fp}
    if spec.client:
        # The client runs it: the run rests in acting until `report` brings the result.
        current["client"] = True
    prior = _prior_call(new, fp) if verdict.action != "deny" else None
    if prior is not None:
        already = _already_ran(new, current, args, spec, verdict, prior, t, deps)
        if already is not None:
            return already
    if verdict.action == "allow":
        new.current_call = current
        t.intent = _intent(new, current, args)
        t.to_state = ACTING
        return _move(new, ACTING, t)
    if verdict.action == "ask":
        new.current_call = current
        new.approval = {"kind": "policy", "reason": verdict.reason}
        t.approval = _approval_row(new, current, args, "policy", verdict.reason, spec, verdict)
        _set_expiry(new, t, deps.now())
        t.to_state = AWAITING_APPROVAL
        return _move(new, AWAITING_APPROVAL, t)
    if verdict.no_approver:
        t.approval = {**_approval_row(new, current, args, decisions.POLICY, verdict.reason, spec, verdict), "status": decisions.DENIED}
    t.messages.append(_tool_message(call, policy.not_permitted(verdict.reason)))
    t.to_state = PLANNING
    return _move(new, PLANNING, t)


def _recorded(history: History | None, t: Move) -> Answer | None:
    """The run's history provider, keeping on the move what it answered: the store
    checks those figures again under its locks when it commits (store.commit)."""
    if history is None:
        return None

    def answer(queries: Sequence[Query]) -> list[Figures]:
        figures = history.figures(queries)
        t.history.extend(zip(queries, figures, strict=True))
        return figures

    return answer


def _prior_call(state: RunState, fp: str) -> dict[str, Any] | None:
    """The parent's call with this fingerprint that took effect after the fork point."""
    if not state.fork:
        return None
    return next((p for p in state.fork.get("prior") or () if p.get("fp") == fp), None)


def prior_reason(prior: dict[str, Any]) -> str:
    where = f"this exact call already ran in run #{prior.get('run')} at step {prior.get('seq')}"
    if prior.get("status") != "succeeded":
        return f"{where}; outcome unknown: it may or may not have taken effect"
    return where


def _already_ran(
    new: RunState,
    current: dict[str, Any],
    args: Any,
    spec: ToolSpec,
    verdict: policy.Verdict,
    prior: dict[str, Any],
    t: Move,
    deps: Deps,
) -> Outcome | None:
    """A fork's call that its parent already made after the fork point: never repeated
    blindly. A safe tool reuses the recorded result (the fork's `reuse`: "recorded") or
    runs again ("none", or no result to reuse); an unsafe or irreversible one asks a
    human: reuse that result, run it again, or reject. None: go on as any call.

    Each of the parent's calls is met once: a second identical proposal is a new call."""
    assert new.fork is not None
    rest = list(new.fork.get("prior") or [])
    rest.remove(prior)
    new.fork = {**new.fork, "prior": rest}
    ref = {k: prior.get(k) for k in ("run", "seq", "step", "status", "key")}
    t.detail["prior"] = ref
    if spec.retry_safety == "safe" and spec.risk != "irreversible":
        if new.fork.get("reuse") != "recorded" or prior.get("status") != "succeeded":
            return None
        new.current_call = {**current, "reuse": ref}
        t.intent = _intent(new, new.current_call, args)
        t.to_state = ACTING
        return _move(new, ACTING, t)
    reason = prior_reason(prior)
    if verdict.action == "ask":
        reason = f"{reason}; and {verdict.reason}"
    new.current_call = current
    new.approval = {"kind": decisions.ALREADY_RAN, "reason": reason, "prior": ref}
    row = _approval_row(new, current, args, decisions.ALREADY_RAN, reason, spec, verdict)
    if verdict.action != "ask":
        # The prior run asks here, not the policy: a rule that would have allowed the call
        # is no reason it was asked, and the card must not name it as one.
        row["rule"], row["required"] = None, 1
    t.approval = {**row, "prior": ref}
    _set_expiry(new, t, deps.now())
    t.to_state = AWAITING_APPROVAL
    return _move(new, AWAITING_APPROVAL, t)


def verdict_for(
    state: RunState, spec: ToolSpec | None, tool: str, args: Any, fp: str, history: Answer | None = None
) -> policy.Verdict:
    """The run's policy on one call: what the model proposed, a reviewer's edit, or a
    recorded call a backtest judges again (agents/runs/backtest.py): the one judge.
    `history` answers the history rules' queries (None: they fail closed)."""
    return policy.verdict(
        spec,
        tool,
        denied=state.denied_tools,
        always_ask=state.always_ask_tools,
        tainted=state.tainted,
        approver=state.approver,
        args=args,
        policy=state.policy,
        grants=state.grants,
        fingerprint=fp,
        history=history,
    )


def _fail_from(new: RunState, t: Move, reason: str) -> Outcome:
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


def _intent(state: RunState, call: dict[str, Any], args: Any) -> IntentRow:
    return {
        "key": call["key"], "fp": call["fp"], "call_id": call["id"], "tool": call["tool"], "args": args,
        "step": state.steps,
    }


def _set_expiry(new: RunState, t: Move, now: float) -> None:
    """A policy approval expires after the run's approval timeout, never after the
    run's deadline (which fails the run first). No timeout: only the deadline."""
    timeout = new.policy.get("approval_timeout_seconds")
    if not timeout or new.approval is None or t.approval is None:
        return
    expires_at = min(now + timeout, new.deadline) if new.deadline else now + timeout
    new.approval.update(expires_at=expires_at, timeout_seconds=timeout)
    t.approval["expires_at"] = expires_at


def _approval_row(
    state: RunState,
    call: dict[str, Any],
    args: Any,
    kind: str,
    reason: str,
    spec: ToolSpec | None,
    verdict: policy.Verdict | None = None,
) -> ApprovalRow:
    return {
        "rule": verdict.rule if verdict else None,
        "required": verdict.required if verdict else 1,
        "shadow": [dict(s) for s in verdict.shadow] if verdict else [],
        "history": verdict.history if verdict else None,
        "kind": kind,
        "key": call["key"],
        "call_id": call["id"],
        "tool": call["tool"],
        "args": args,
        "risk": spec.risk if spec else "irreversible",
        "reason": reason,
        "taint_source": state.taint_source if state.tainted else None,
        "step": state.steps,
        "status": decisions.PENDING,
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
    t.approval = _approval_row(new, call, call_args(state, call), "outcome_unknown", reason, spec)
    return _move(new, AWAITING_APPROVAL, t)


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
    t.messages.append(_tool_message(call, result))
    if stored is None or reused is not None:
        t.journal_result = {"key": call["key"], "fp": call["fp"], "status": "succeeded" if ok else "failed", "result": result}
    return _move(new, PLANNING, t)


def _tool_message(call: dict[str, Any], result: Any) -> dict[str, Any]:
    text = result_text(result)
    if call.get("edited"):
        # The model proposed other arguments: it must not read this result as the
        # outcome of its own call.
        text = edit_statement(call) + "\n" + text
    return {"role": "tool", "tool_call_id": call["id"], "name": call["tool"], "content": cap(text)}


def edit_statement(call: dict[str, Any]) -> str:
    edit = call["edited"]
    who = f" ({edit['by']})" if edit.get("by") else ""
    why = f" Their note: {edit['note']}" if edit.get("note") else ""
    return (
        f"[airlock: a human reviewer{who} changed the arguments of this call before approving it. "
        f"You proposed {json.dumps(edit['from'], ensure_ascii=False, sort_keys=True)}; "
        f"it ran with {json.dumps(call['args'], ensure_ascii=False, sort_keys=True)}.{why}]"
    )


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


def _move(new: RunState, to_state: str, t: Move) -> Outcome:
    check_edge(t.from_state, to_state)
    new.state = to_state
    new.messages = [*new.messages, *t.messages]
    return new, t
