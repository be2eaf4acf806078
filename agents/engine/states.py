"""The seven run states and the one table of legal edges (as data)."""

from __future__ import annotations

QUEUED = "queued"
PLANNING = "planning"
ACTING = "acting"
AWAITING_APPROVAL = "awaiting_approval"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"

STATES: tuple[str, ...] = (QUEUED, PLANNING, ACTING, AWAITING_APPROVAL, DONE, FAILED, CANCELLED)
TERMINAL: frozenset[str] = frozenset({DONE, FAILED, CANCELLED})
ACTIVE: frozenset[str] = frozenset(STATES) - TERMINAL

# An external agent's run (docs/gateway.md) takes these same edges: its client's
# proposal is the model's decision, a client tool's report the tool result, its finish
# the final answer. It rests in planning or acting (step() returns None) meanwhile.
EDGES: frozenset[tuple[str, str]] = frozenset(
    {
        (QUEUED, PLANNING),  # a worker picks the run up
        (PLANNING, DONE),  # the model gave a final answer
        (PLANNING, ACTING),  # a proposed call that policy allows
        (PLANNING, AWAITING_APPROVAL),  # policy says ask
        (PLANNING, PLANNING),  # denied or invalid call: the refusal is a tool result
        (ACTING, PLANNING),  # tool result recorded
        (ACTING, AWAITING_APPROVAL),  # resume found an unsafe call with no result
        (AWAITING_APPROVAL, ACTING),  # approved, or "run it again"
        (AWAITING_APPROVAL, PLANNING),  # rejected, or "it happened"
    }
    | {(state, end) for state in ACTIVE for end in (FAILED, CANCELLED)}
)


class IllegalTransition(RuntimeError):
    """A transition outside EDGES: a programming error, never a run outcome."""


def check_edge(from_state: str, to_state: str) -> None:
    if (from_state, to_state) not in EDGES:
        raise IllegalTransition(f"{from_state} -> {to_state} is not a legal edge")
