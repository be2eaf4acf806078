"""step(): advance a run by exactly one transition.

The engine never continues on its own: the driver persists every transition before it
asks for the next one. A step returns the new state and a `Move` describing what
to write (the transition row, appended messages, journal and approval effects), or None
when the run rests (terminal, or waiting for a human).

The run's state and the types are in run.py; a step in `planning` is the model's turn
(planning.py), in `acting` the tool's (acting.py); what people do to a run (answer,
edit, revoke, cancel) is in human.py.
"""

from __future__ import annotations

from . import limits as limits_mod
from .acting import run_tool
from .human import expire
from .planning import call_model, compact, propose
from .protocols import Deps
from .run import Move, Outcome, RunState, fail, move_to, proposed_call
from .states import ACTING, AWAITING_APPROVAL, PLANNING, QUEUED, TERMINAL


def step(state: RunState, deps: Deps) -> Outcome | None:
    """Advance one transition, or return None when the run rests."""
    if state.state in TERMINAL:
        return None
    if state.state == QUEUED:
        return move_to(state.copy(), PLANNING, Move(QUEUED, PLANNING, "pickup"))
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
            return propose(new, call, deps, Move(PLANNING, PLANNING, "call"))
        if state.context_tokens:
            compacted = compact(state, deps)
            if compacted is not None:
                return compacted
        return call_model(state, deps)
    assert state.state == ACTING
    return run_tool(state, deps)
