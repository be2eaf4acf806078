"""The moves people make on a run: a reviewer's answer to the pending approval (and
its edit of the call), no answer in time, a grant revoked, votes withdrawn, a cancel.
"""

from __future__ import annotations

from typing import Any

from . import decisions, policy
from .fingerprints import fingerprint, idempotency_key
from .history import Answer
from .planning import verdict_for
from .registry import ToolSpec
from .run import OUTCOME_UNKNOWN, Move, Outcome, RunState, call_args, fail, intent_row, move_to
from .states import ACTING, AWAITING_APPROVAL, CANCELLED, PLANNING, TERMINAL
from .transcript import tool_message


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
    t.messages.append(tool_message(call, policy.not_permitted(reason)))
    return move_to(new, PLANNING, t)


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
        t.intent = intent_row(new, call, call_args(new, call))
        return move_to(new, ACTING, t)
    if decision in ("approve", "retry"):
        t = Move(AWAITING_APPROVAL, ACTING, "decision", detail)
        if decision == "approve":
            t.intent = intent_row(new, call, call_args(new, call))
            t.grant = grant_effect
        else:
            t.journal_reset = call["key"]
        return move_to(new, ACTING, t)
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
    t.messages.append(tool_message(call, result))
    return move_to(new, PLANNING, t)


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
