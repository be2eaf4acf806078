"""The one list of approval statuses, kinds and decision names, and the vote rule.

Pages, the API, the evals and the ORM's `TextChoices` all derive from these names;
nothing else spells them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

# Approval statuses.
PENDING = "pending"
APPROVED = "approved"
REJECTED = "rejected"
EXPIRED = "expired"  # nobody answered in time: never a rejection
DENIED = "denied"  # policy said ask, but the run has no approver
StatusName = Literal["pending", "approved", "rejected", "expired", "denied"]
STATUSES: tuple[str, ...] = get_args(StatusName)
assert STATUSES == (PENDING, APPROVED, REJECTED, EXPIRED, DENIED)

# Approval kinds.
POLICY = "policy"
OUTCOME_UNKNOWN = "outcome_unknown"
# A fork's call that already took effect in the run it was forked from (docs/retry.md).
ALREADY_RAN = "already_ran"
KINDS: tuple[str, ...] = (POLICY, OUTCOME_UNKNOWN, ALREADY_RAN)

DecisionName = Literal["approve", "reject", "happened", "retry", "fail", "reuse"]
DECISIONS: tuple[str, ...] = get_args(DecisionName)
KIND_DECISIONS: dict[str, tuple[str, ...]] = {
    POLICY: ("approve", "reject"),
    OUTCOME_UNKNOWN: ("happened", "retry", "fail"),
    # reuse: the earlier run's recorded result stands in, nothing runs; approve runs it again.
    ALREADY_RAN: ("reuse", "approve", "reject"),
}
# The approval status each decision closes it with.
DECISION_STATUS: dict[str, str] = {
    "approve": APPROVED,
    "reject": REJECTED,
    "happened": APPROVED,
    "retry": APPROVED,
    "fail": REJECTED,
    "reuse": APPROVED,
}
# How a decided card and the timeline name each answer.
DECISION_LABELS: dict[str, str] = {
    "approve": "Approved",
    "reject": "Rejected",
    "happened": "Marked as happened",
    "retry": "Run again",
    "fail": "Run failed",
    "reuse": "Reused the recorded result",
}
# Answers that settle a question on their own whatever the quorum: a "no", and every
# answer to "outcome unknown" (one reviewer says what happened), and a reuse, which runs
# nothing.
DECIDES_ALONE: frozenset[str] = frozenset({"reject", "happened", "retry", "fail", "reuse"})


def allowed(kind: str) -> tuple[str, ...]:
    return KIND_DECISIONS.get(kind, ())


REMEMBER = ("call", "tool")


def choices(kind: str, *, reusable: bool = True) -> tuple[str, ...]:
    """The answers an approval offers: its kind's, without `reuse` when the earlier
    call's outcome is unknown (there is no result to reuse)."""
    return tuple(d for d in allowed(kind) if reusable or d != "reuse")


def refusal(
    kind: str, decision: str, *, edits: bool, remember: str | None, reusable: bool = True
) -> tuple[str, str] | None:
    """(error code, message) when this answer cannot be given to an approval of this
    kind at all, whoever gives it: the one statement of the rule the action checks
    before it locks anything and the engine checks again on the state it steps.
    `reusable`: an "already ran" approval whose earlier call finished (a result exists)."""
    if decision == "reuse" and kind == ALREADY_RAN and not reusable:
        return "invalid_decision", "the earlier call's outcome is unknown: there is no recorded result to reuse"
    offered = choices(kind, reusable=reusable)
    if decision not in offered:
        return "invalid_decision", f"a {kind} approval takes {' or '.join(offered)}, not {decision!r}"
    if edits and decision != "approve":
        return "invalid_decision", "only an approval can change the arguments"
    if remember is not None and (remember not in REMEMBER or decision != "approve"):
        return "invalid_remember", "remember takes 'call' or 'tool', and only with approve"
    return None


def label(decision: str, status: str) -> str:
    if status == EXPIRED:
        return "Expired"
    return DECISION_LABELS.get(decision, status.capitalize())


def status_text(status: str, decision: str) -> str:
    """The status as the timeline and a conflict name it: 'rejected', not 'rejected
    (reject)'; the answer is added only where it says more ('approved (run again)')."""
    if decision in ("", "approve", "reject") or status == EXPIRED:
        return status
    return f"{status} ({label(decision, status).lower()})"


@dataclass(frozen=True)
class Tally:
    """Where the votes stand: `decision` is set once they decide the question."""

    approvals: int
    required: int
    decision: str | None

    @property
    def missing(self) -> int:
        return max(0, self.required - self.approvals)


def tally(votes: list[dict[str, Any]], required: int) -> Tally:
    """The two-person rule on a list of `{by, decision}` votes, oldest first.

    Each reviewer counts once (their first vote); any vote that decides alone (a reject)
    decides at once; approvals decide when `required` distinct reviewers gave one.
    """
    required = max(1, int(required or 1))
    seen: set[str] = set()
    approvals = 0
    for vote in votes:
        by = str(vote.get("by") or "")
        if by in seen:
            continue
        seen.add(by)
        decision = str(vote.get("decision"))
        if decision in DECIDES_ALONE:
            return Tally(approvals, required, decision)
        if decision == "approve":
            approvals += 1
    return Tally(approvals, required, "approve" if approvals >= required else None)


def stale_vote(*, current: str, seen: str | None, edited: bool) -> str | None:
    """Why a decision may not count for the call as it stands now, or None.

    A vote is bound to the call its voter saw: `seen` is that call's `args_hash` (None
    when the decision did not name one) and `current` the hash of the call that would
    run. A decision naming another call is stale. One naming none is taken to have seen
    the agent's call, which holds only while nobody has edited it (`edited`): once the
    arguments changed, a vote that cannot say it saw the change never counts for it, or
    one reviewer's edit could collect another's approval of the original.
    """
    if seen is None:
        return "the call was edited and this answer names no args_hash" if edited else None
    if seen != current:
        return "the call changed since you saw it"
    return None
