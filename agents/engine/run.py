"""A run as the engine sees it: its state, what a step returns, and the moves every
part of the engine may make (a run that ends, the rows a move asks the store to write).

The step is in step.py, the model's turn in planning.py, the tool's in acting.py and
the people's moves in human.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, NotRequired, TypedDict

from . import decisions, patch, policy
from . import limits as limits_mod
from .history import Figures, Query
from .policy import APPROVERS, HUMAN
from .registry import ToolSpec
from .states import AWAITING_APPROVAL, FAILED, QUEUED, check_edge

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

    def engine_json(self, *, policy: bool = True) -> dict[str, Any]:
        """The state without the transcript (stored as message rows), nulls dropped;
        without `policy`, without the policy too (a commit that keeps the stored one)."""
        # Not asdict(): it would deep-copy the whole transcript on every step.
        return patch.compact(self._fields(policy))  # type: ignore[no-any-return]

    def _fields(self, policy: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _STATE_FIELDS if policy or name != "policy"}

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
    return move_to(new, actor_state, transition)


def proposed_call(state: RunState, call_id: str) -> dict[str, Any]:
    """The call with this id as the model proposed it (the newest such message wins)."""
    for message in reversed(state.messages):
        for call in message.get("tool_calls") or ():
            if call["id"] == call_id:
                return {"id": call["id"], "tool": call["tool"], "args": call["args"]}
    raise LookupError(f"no proposed call {call_id!r} in the transcript")


def call_args(state: RunState, call: dict[str, Any]) -> Any:
    """The arguments a call runs with: a reviewer's edit, or what the model proposed."""
    if "args" in call:
        return call["args"]
    return proposed_call(state, call["id"])["args"]


def intent_row(state: RunState, call: dict[str, Any], args: Any) -> IntentRow:
    return {
        "key": call["key"], "fp": call["fp"], "call_id": call["id"], "tool": call["tool"], "args": args,
        "step": state.steps,
    }


def approval_row(
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


def move_to(new: RunState, to_state: str, t: Move) -> Outcome:
    check_edge(t.from_state, to_state)
    new.state = to_state
    new.messages = [*new.messages, *t.messages]
    return new, t
