"""Decisions beyond yes/no in the pure engine: the vote rule, edit then approve, expiry.

No database: an in-memory journal, an inline tool runner and a model that replays
decisions; every step is one `step()` or `decide()` call.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from agents.engine import decisions, limits, policy
from agents.engine.fingerprints import args_hash, idempotency_key
from agents.engine.human import EditRefused, apply_decision, check_edit
from agents.engine.protocols import Deps, ModelReply, ModelRequest, ProposedCall, ToolOutcome
from agents.engine.registry import Registry, ToolContext, ToolSpec
from agents.engine.run import Move, RunState, new_run, proposed_call
from agents.engine.step import step
from tests.engine.harness import BlankJournal

T0 = 1_000_000.0
TRANSFER_SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
    "required": ["to", "amount"],
    "additionalProperties": False,
}
RULES = [
    {"tool": "transfer", "when": {"arg": "amount", "op": "gt", "value": 10_000}, "then": "deny",
     "reason": "no transfer over 10,000"},
    {"tool": "transfer", "when": {"arg": "amount", "op": "gt", "value": 500}, "then": "ask", "approvals": 3,
     "reason": "transfers over 500 need three people"},
    {"tool": "transfer", "then": "ask", "approvals": 2, "reason": "transfers need two people"},
]


class Runner:
    def __init__(self) -> None:
        self.ran: list[tuple[Any, str]] = []

    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        self.ran.append((args, ctx.idempotency_key))
        return ToolOutcome(ok=True, value=f"sent {args['amount']} to {args['to']}")


class Model:
    def __init__(self, *replies: ModelReply) -> None:
        self.replies = list(replies)
        self.seen: list[ModelRequest] = []

    def propose(self, request: ModelRequest) -> ModelReply:
        self.seen.append(request)
        return self.replies.pop(0)


def transfer(amount: float, to: str = "ACME") -> ModelReply:
    return ModelReply(calls=(ProposedCall("call_1", "transfer", {"to": to, "amount": amount}),))


def deps(model: Model, now: float = T0) -> Deps:
    spec = ToolSpec("transfer", "pay someone", TRANSFER_SCHEMA, "write", "internal", "safe", lambda a, c: None)
    return Deps(model=model, registry=Registry([spec]), journal=BlankJournal(), runner=Runner(), now=lambda: now)


def waiting(amount: float = 100, *, timeout: int | None = None, on_expiry: str = "reject", deadline: int = 900,
            model: Model | None = None) -> tuple[RunState, Deps, Move]:
    """A run whose first call waits for reviewers."""
    pol = policy.snapshot(
        {"rules": RULES, "approval_timeout_seconds": timeout, "on_expiry": on_expiry, "separate_duties": False}
    )
    state = new_run(
        "7", limits=limits.Limits.from_dict({"deadline_seconds": deadline}), now=T0, policy=pol, task="pay ACME"
    )
    d = deps(model or Model(transfer(amount), ModelReply(final="paid")))
    state, _ = step(state, d)  # pickup
    state, t = step(state, d)  # the model proposes; policy asks
    assert state.state == "awaiting_approval", state.error
    return state, d, t


# -- the vote rule -------------------------------------------------------------------


def vote(by: str, decision: str = "approve") -> dict[str, str]:
    return {"by": by, "decision": decision}


def test_approvals_decide_once_enough_distinct_reviewers_voted() -> None:
    assert decisions.tally([vote("rita")], 2).decision is None
    assert decisions.tally([vote("rita")], 2).missing == 1
    assert decisions.tally([vote("rita"), vote("rob")], 2).decision == "approve"
    assert decisions.tally([vote("rita")], 1).decision == "approve"


def test_the_same_reviewer_twice_counts_once() -> None:
    t = decisions.tally([vote("rita"), vote("rita"), vote("rita")], 2)
    assert (t.approvals, t.decision) == (1, None)
    # Their first vote stands: a later reject by the same person changes nothing.
    assert decisions.tally([vote("rita"), vote("rita", "reject")], 2).decision is None


def test_any_reject_decides_at_once() -> None:
    assert decisions.tally([vote("rita"), vote("rob", "reject")], 3).decision == "reject"
    assert decisions.tally([vote("rob", "reject")], 2).decision == "reject"


def test_outcome_unknown_answers_decide_alone() -> None:
    for answer in ("happened", "retry", "fail"):
        assert decisions.tally([vote("rita", answer)], 2).decision == answer


def test_a_vote_counts_only_for_the_call_its_voter_saw() -> None:
    seen = args_hash({"to": "customer 1042", "amount": 10})
    edited = args_hash({"to": "XX00 ATTACKER", "amount": 10000})
    assert decisions.stale_vote(current=seen, seen=seen, edited=False) is None
    assert decisions.stale_vote(current=seen, seen=None, edited=False) is None  # only ever one call
    assert decisions.stale_vote(current=edited, seen=edited, edited=True) is None
    assert decisions.stale_vote(current=edited, seen=seen, edited=True) == "the call changed since you saw it"
    assert decisions.stale_vote(current=edited, seen=None, edited=True)  # an edited call must be named
    assert decisions.stale_vote(current=seen, seen=edited, edited=False)


def test_the_args_hash_is_sha256_of_the_canonical_json() -> None:
    assert args_hash({"b": 1, "a": "é"}) == args_hash({"a": "é", "b": 1})
    assert args_hash({"a": "é", "b": 1}) == hashlib.sha256('{"a":"é","b":1}'.encode()).hexdigest()


def test_every_decision_has_a_status_a_label_and_a_kind() -> None:
    assert set(decisions.DECISION_STATUS) == set(decisions.DECISIONS) == set(decisions.DECISION_LABELS)
    assert {d for ds in decisions.KIND_DECISIONS.values() for d in ds} == set(decisions.DECISIONS)
    assert decisions.label("", decisions.EXPIRED) == "Expired" != decisions.label("reject", decisions.REJECTED)


# -- required votes on the approval ---------------------------------------------------


def test_the_matching_rule_sets_the_votes_the_approval_needs() -> None:
    state, _d, t = waiting(100)
    assert t.approval is not None and t.approval["required"] == 2
    assert t.approval["rule"]["reason"] == "transfers need two people"
    assert t.approval.get("expires_at") is None


# -- edit, then approve ----------------------------------------------------------------


def test_an_edited_call_runs_with_the_reviewers_arguments_under_a_new_key() -> None:
    state, d, _t = waiting(100)
    original_key = state.current_call["key"]
    edited = {"to": "ACME Ltd", "amount": 90}
    verdict = check_edit(state, d.registry.get("transfer"), edited)
    assert verdict.action == "ask" and verdict.required == 2

    after, t = apply_decision(state, "approve", "ok", by="rob", edit={"args": edited, "by": "rita", "note": "typo"})
    new_key = idempotency_key("7", state.steps, "transfer", edited)
    assert new_key != original_key and t.intent is not None
    assert (t.intent["key"], t.intent["args"]) == (new_key, edited)
    assert t.detail["edit"] == {"from": {"to": "ACME", "amount": 100}, "to": edited, "by": "rita", "note": "typo",
                                "key": new_key}
    # The proposing message keeps the model's own arguments: the provider's transcript is what it sent.
    assert proposed_call(after, "call_1")["args"] == {"to": "ACME", "amount": 100}

    after, t = step(after, d)
    assert d.runner.ran == [(edited, new_key)]
    [message] = t.messages
    assert message["role"] == "tool" and "sent 90 to ACME Ltd" in message["content"]
    statement = message["content"].splitlines()[0]
    assert "a human reviewer (rita) changed the arguments" in statement
    assert json.dumps({"amount": 100, "to": "ACME"}) in statement and json.dumps(
        {"amount": 90, "to": "ACME Ltd"}) in statement
    assert "typo" in statement
    # The next model call reads it.
    after, _ = step(after, d)
    assert after.state == "done"
    assert any("changed the arguments" in m["content"] for m in d.model.seen[-1].messages if m["role"] == "tool")


def test_an_edit_with_invalid_arguments_is_refused_with_the_schema_error() -> None:
    state, d, _t = waiting(100)
    with pytest.raises(EditRefused) as refused:
        check_edit(state, d.registry.get("transfer"), {"to": "ACME", "amount": "lots"})
    assert refused.value.code == "invalid_arguments" and refused.value.status == 400
    assert "amount" in refused.value.detail and "number" in refused.value.detail


def test_an_edit_into_a_denied_call_is_refused_naming_the_rule() -> None:
    state, d, _t = waiting(100)
    with pytest.raises(EditRefused) as refused:
        check_edit(state, d.registry.get("transfer"), {"to": "ACME", "amount": 50_000})
    assert refused.value.code == "denied_by_policy" and refused.value.status == 409
    assert refused.value.detail["rule"]["reason"] == "no transfer over 10,000"
    assert refused.value.detail["rule"]["index"] == 1


def test_an_edit_that_needs_more_votes_says_so() -> None:
    state, d, _t = waiting(100)
    verdict = check_edit(state, d.registry.get("transfer"), {"to": "ACME", "amount": 800})
    assert verdict.action == "ask" and verdict.required == 3


def test_only_an_approval_can_carry_an_edit() -> None:
    state, _d, _t = waiting(100)
    with pytest.raises(ValueError):
        apply_decision(state, "reject", edit={"args": {"to": "x", "amount": 1}})


def test_an_unchanged_edit_runs_the_original_call() -> None:
    state, _d, _t = waiting(100)
    _after, t = apply_decision(state, "approve", edit={"args": {"amount": 100, "to": "ACME"}, "by": "rita"})
    assert t.intent is not None and t.intent["key"] == state.current_call["key"] and "edit" not in t.detail


# -- expiry ------------------------------------------------------------------------------


def test_an_approval_expires_after_the_runs_timeout_bounded_by_its_deadline() -> None:
    state, _d, t = waiting(100, timeout=60)
    assert t.approval["expires_at"] == T0 + 60 == state.approval["expires_at"]
    state, _d, t = waiting(100, timeout=600, deadline=120)
    assert t.approval["expires_at"] == T0 + 120


def test_nothing_happens_before_the_approval_expires() -> None:
    state, d, _t = waiting(100, timeout=60)
    assert step(state, deps(d.model, now=T0 + 59)) is None


def test_expiry_with_reject_tells_the_model_and_the_run_goes_on() -> None:
    state, d, _t = waiting(100, timeout=60)
    after, t = step(state, deps(d.model, now=T0 + 60))
    assert (t.kind, t.from_state, t.to_state) == ("expiry", "awaiting_approval", "planning")
    assert t.approval_close == decisions.EXPIRED
    [message] = t.messages
    assert json.loads(message["content"]) == {
        "ok": False, "error": "not_permitted", "detail": "no reviewer answered within 60 s"}
    assert after.approval is None and after.current_call is None
    after, _ = step(after, deps(d.model, now=T0 + 61))
    assert after.state == "done" and after.answer == "paid"


def test_expiry_with_fail_ends_the_run_with_the_reason() -> None:
    state, d, _t = waiting(100, timeout=60, on_expiry="fail")
    after, t = step(state, deps(d.model, now=T0 + 61))
    assert (t.kind, t.to_state, after.state) == ("expiry", "failed", "failed")
    assert after.error == "no reviewer answered within 60 s"
    assert t.approval_close == decisions.EXPIRED and t.detail["on_expiry"] == "fail"


def test_the_deadline_still_fails_a_run_whose_approval_has_no_timeout() -> None:
    state, d, t = waiting(100, timeout=None, deadline=120)
    assert "expires_at" not in state.approval and t.approval.get("expires_at") is None
    after, t = step(state, deps(d.model, now=T0 + 121))
    assert after.state == "failed" and t.kind == "fail" and "deadline" in after.error
