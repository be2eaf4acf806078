"""Argument rules, launch tightening and run-scoped grants, in the pure engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from agents.engine import policy
from agents.engine.conditions import Unevaluable, holds
from agents.engine.fingerprints import fingerprint
from agents.engine.human import apply_decision, revoke_grant
from agents.engine.limits import Limits
from agents.engine.policy import PolicyError, first_match, snapshot, validate_rules
from agents.engine.policy import verdict as policy_verdict
from agents.engine.protocols import Deps, JournalEntry, ModelReply, ModelRequest, ProposedCall, ToolOutcome
from agents.engine.registry import Registry, ToolContext, ToolSpec
from agents.engine.run import RunState, new_run
from agents.engine.step import step

ARGS = {
    "amount": 150,
    "currency": "EUR",
    "to": ["ann@ours.example", "bob@elsewhere.example"],
    "order": {"id": "A-17", "total": 99.5, "paid": True},
    "items": [{"sku": "PAN-1", "qty": 2}, {"sku": "KNIFE-3", "qty": 1}],
    "note": None,
}


def c(arg: str, op: str, value: Any = None) -> dict[str, Any]:
    return {"arg": arg, "op": op, "value": value}


@pytest.mark.parametrize(
    "cond, expected",
    [
        (c("currency", "eq", "EUR"), True),
        (c("currency", "eq", "USD"), False),
        (c("order.paid", "eq", 1), False),  # JSON true is not the number 1
        (c("note", "eq", None), True),
        (c("currency", "ne", "USD"), True),
        (c("currency", "ne", "EUR"), False),
        (c("amount", "gt", 100), True),
        (c("amount", "gt", 150), False),
        (c("amount", "gte", 150), True),
        (c("amount", "lt", 150), False),
        (c("amount", "lte", 150), True),
        (c("order.total", "lt", 100), True),
        (c("currency", "gt", "AAA"), True),  # text compares with text
        (c("currency", "in", ["EUR", "USD"]), True),
        (c("currency", "in", ["GBP"]), False),
        (c("currency", "not_in", ["GBP"]), True),
        (c("currency", "not_in", ["EUR"]), False),
        (c("order.id", "contains", "-1"), True),
        (c("to", "contains", "ann@ours.example"), True),  # a list contains an element
        (c("to", "contains", "ann"), False),
        (c("order", "contains", "total"), True),  # an object contains a key
        (c("order.id", "matches", r"^A-\d+$"), True),
        (c("order.id", "matches", r"\d{3}"), False),
        (c("currency", "matches", "UR"), True),  # searched, not anchored
        ({"arg": "order.total", "op": "exists"}, True),
        ({"arg": "order.refund", "op": "exists"}, False),
        (c("order.refund", "exists", False), True),
        (c("missing", "eq", 1), False),
        (c("missing", "ne", 1), False),  # an absent value is not "different"
    ],
)
def test_every_op(cond: dict[str, Any], expected: bool) -> None:
    assert holds(cond, ARGS) is expected


@pytest.mark.parametrize(
    "cond, expected",
    [
        (c("items.0.sku", "eq", "PAN-1"), True),
        (c("items.1.sku", "eq", "PAN-1"), False),
        (c("items.5.sku", "eq", "PAN-1"), False),
        (c("items.sku", "eq", "KNIFE-3"), True),  # any element of the list
        (c("items.qty", "gt", 1), True),
        (c("items.qty", "gt", 2), False),
        (c("to", "matches", "@elsewhere"), True),  # a list value: any element
        (c("to", "not_in", ["ann@ours.example"]), True),  # one recipient is outside
        (c("to", "not_in", ["ann@ours.example", "bob@elsewhere.example"]), False),
    ],
)
def test_paths_reach_into_lists(cond: dict[str, Any], expected: bool) -> None:
    assert holds(cond, ARGS) is expected


def test_all_and_any_combine_and_nest() -> None:
    big, eur, usd = c("amount", "gt", 100), c("currency", "eq", "EUR"), c("currency", "eq", "USD")
    assert holds({"all": [big, eur]}, ARGS)
    assert not holds({"all": [big, usd]}, ARGS)
    assert holds({"any": [usd, big]}, ARGS)
    assert not holds({"any": [usd, c("amount", "lt", 1)]}, ARGS)
    assert holds({"all": [{"any": [usd, eur]}, big]}, ARGS)


def test_a_part_that_cannot_be_evaluated_decides_only_when_it_matters() -> None:
    broken = c("currency", "gt", 5)  # text against a number
    with pytest.raises(Unevaluable):
        holds(broken, ARGS)
    assert holds({"any": [broken, c("amount", "gt", 1)]}, ARGS)
    assert not holds({"all": [broken, c("amount", "gt", 1000)]}, ARGS)
    with pytest.raises(Unevaluable):
        holds({"all": [broken, c("amount", "gt", 1)]}, ARGS)


def spec(name: str = "refund", risk: str = "write") -> ToolSpec:
    return ToolSpec(name, "", {"type": "object"}, risk, "internal", "safe", lambda a, ctx: "ok")  # type: ignore[arg-type]


def rule(then: str, when: dict[str, Any] | None = None, tool: str = "refund", **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"tool": tool, "then": then, "reason": f"{then} rule", **extra}
    if when is not None:
        r["when"] = when
    return r


def verdict(rules: list[dict[str, Any]], args: Any = ARGS, *, risk: str = "write", **kw: Any) -> policy.Verdict:
    pol = snapshot({"rules": rules, **kw.pop("profile", {})}, kw.pop("launch", None))
    options = {"denied": [], "always_ask": [], "tainted": False, "approver": "human", **kw}
    return policy_verdict(spec(risk=risk), "refund", args=args, policy=pol, **options)


def test_the_first_matching_rule_decides_with_its_reason_and_position() -> None:
    rules = [
        rule("deny", c("amount", "gt", 1000)),
        rule("ask", c("amount", "gt", 100), approvals=2, reason="refunds over 100 need a human"),
        rule("allow"),
    ]
    v = verdict(rules)
    assert (v.action, v.reason, v.required) == ("ask", "refunds over 100 need a human", 2)
    assert v.rule is not None and policy.rule_label(v.rule) == "rule 2 of the profile"
    assert verdict(rules, {**ARGS, "amount": 5000}).action == "deny"
    small = verdict(rules, {**ARGS, "amount": 10})
    assert small.action == "allow" and small.rule is not None and small.rule["index"] == 3


def test_rules_for_other_tools_are_skipped_and_star_matches_every_tool() -> None:
    assert verdict([rule("deny", tool="send_email")]).action == "allow"
    assert verdict([rule("deny", tool="*")]).action == "deny"


def test_with_no_matching_rule_the_risk_default_applies() -> None:
    v = verdict([rule("allow", c("amount", "lt", 20))], risk="irreversible", profile={"irreversible_approvals": 2})
    assert (v.action, v.reason, v.rule, v.required) == ("ask", "refund is irreversible", None, 2)


def test_an_ask_rule_on_an_irreversible_tool_gives_its_reason_and_never_fewer_votes() -> None:
    profile = {"irreversible_approvals": 2}
    v = verdict([rule("ask", reason="refunds need a human")], risk="irreversible", profile=profile)
    assert (v.action, v.reason, v.required) == ("ask", "refunds need a human", 2)
    v = verdict([rule("ask", approvals=3)], risk="irreversible", profile=profile)
    assert v.required == 3


def test_an_allow_rule_lets_an_irreversible_call_through() -> None:
    assert verdict([rule("allow", c("amount", "gt", 1))], risk="irreversible").action == "allow"


def test_the_profiles_deny_list_comes_before_any_rule() -> None:
    v = verdict([rule("allow")], denied=["refund"])
    assert v.action == "deny" and v.rule is None


def test_launch_rules_are_evaluated_before_the_profiles() -> None:
    v = verdict([rule("allow")], launch={"rules": [rule("ask", c("amount", "gt", 100), reason="not today")]})
    assert v.action == "ask" and v.reason == "not today"
    assert v.rule is not None and policy.rule_label(v.rule) == "rule 1 of the launch policy"
    assert verdict([rule("allow")], {**ARGS, "amount": 3}, launch={"rules": [rule("ask", c("amount", "gt", 100))]}).action == "allow"


@pytest.mark.parametrize("risk", ["write", "irreversible"])
def test_taint_wins_over_an_allow_rule(risk: str) -> None:
    v = verdict([rule("allow")], risk=risk, tainted=True)
    assert v.action == "ask" and "taint wins" in v.reason and "rule 1 of the profile" in v.reason


def test_a_read_in_a_tainted_run_may_be_allowed_by_a_rule() -> None:
    assert verdict([rule("allow")], risk="read", tainted=True).action == "allow"


@pytest.mark.parametrize(
    "when",
    [
        c("currency", "gt", 100),  # type mismatch
        c("amount", "matches", "1"),  # matches on a number
        c("order.id", "matches", "(unclosed"),  # a bad regex that slipped past validation
        {"arg": "amount", "op": "between", "value": [1, 2]},  # an unknown op
        {"arg": "amount"},  # no op at all
    ],
)
def test_fail_closed_on_what_cannot_be_evaluated(when: dict[str, Any]) -> None:
    assert first_match([rule("allow", when)], "refund", ARGS) is None
    assert first_match([rule("ask", when)], "refund", ARGS) is not None
    assert first_match([rule("deny", when)], "refund", ARGS) is not None


def test_an_ask_without_an_approver_is_a_recorded_denial_naming_the_rule() -> None:
    v = verdict([rule("ask", reason="refunds need a human")], approver="none")
    assert v.action == "deny" and v.no_approver and v.reason == "refunds need a human, and the run has no approver"
    assert v.rule is not None


# -- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "rules, field",
    [
        ({"tool": "x"}, "rules"),
        (["deny"], "rules[1]"),
        ([{"tool": "", "then": "deny", "reason": "r"}], "rules[1].tool"),
        ([{"tool": "x", "then": "maybe", "reason": "r"}], "rules[1].then"),
        ([{"tool": "x", "then": "deny"}], "rules[1].reason"),
        ([{"tool": "x", "then": "deny", "reason": "r", "unless": {}}], "rules[1].unless"),
        ([{"tool": "x", "then": "deny", "reason": "r", "origin": "launch"}], "rules[1].origin"),
        ([{"tool": "x", "then": "deny", "reason": "r", "approvals": 2}], "rules[1].approvals"),
        ([{"tool": "x", "then": "ask", "reason": "r", "approvals": 0}], "rules[1].approvals"),
        ([{"tool": "x", "then": "ask", "reason": "r", "approvals": True}], "rules[1].approvals"),
        ([rule("deny"), rule("deny", {"arg": "a", "op": "like", "value": 1})], "rules[2].when.op"),
        ([rule("deny", {"arg": "a..b", "op": "eq", "value": 1})], "rules[1].when.arg"),
        ([rule("deny", {"arg": "a", "op": "eq"})], "rules[1].when.value"),
        ([rule("deny", {"arg": "a", "op": "in", "value": "x"})], "rules[1].when.value"),
        ([rule("deny", {"arg": "a", "op": "gt", "value": [1]})], "rules[1].when.value"),
        ([rule("deny", {"arg": "a", "op": "matches", "value": "(oops"})], "rules[1].when.value"),
        ([rule("deny", {"arg": "a", "op": "exists", "value": "yes"})], "rules[1].when.value"),
        ([rule("deny", {"all": []})], "rules[1].when.all"),
        ([rule("deny", {"any": [c("a", "eq", 1)], "arg": "b"})], "rules[1].when"),
        ([rule("deny", {"all": [c("a", "eq", 1), {"any": [{"arg": "b", "op": "nope", "value": 1}]}]})],
         "rules[1].when.all[2].any[1].op"),
    ],
)
def test_validation_names_the_first_bad_field(rules: Any, field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        validate_rules(rules)
    assert caught.value.field == field


def test_a_valid_rule_passes_validation_as_written() -> None:
    r = rule("ask", {"any": [c("amount", "gt", 100), {"arg": "items.0.sku", "op": "exists"}]}, approvals=2)
    assert validate_rules([r]) == [r]


@pytest.mark.parametrize(
    "launch, field",
    [
        ({"rules": [rule("allow")]}, "policy.rules[1].then"),
        ({"irreversible_approvals": 1}, "policy.irreversible_approvals"),
        ({"irreversible_approvals": 0}, "policy.irreversible_approvals"),
        ({"separate_duties": False}, "policy.separate_duties"),
        ({"approval_timeout_seconds": 601}, "policy.approval_timeout_seconds"),
        ({"on_expiry": "fail"}, "policy.on_expiry"),
        ({"rules": "deny"}, "policy.rules"),
        ([], "policy"),
    ],
)
def test_a_launch_policy_looser_than_the_profile_is_refused(launch: Any, field: str) -> None:
    profile = {"irreversible_approvals": 2, "separate_duties": True, "approval_timeout_seconds": 600}
    with pytest.raises(PolicyError) as caught:
        snapshot(profile, launch)
    assert caught.value.field == field


def test_a_launch_policy_tightens_every_field() -> None:
    profile = {"rules": [rule("allow")], "irreversible_approvals": 1, "separate_duties": False}
    pol = snapshot(profile, {"rules": [rule("deny")], "irreversible_approvals": 3, "separate_duties": True,
                             "approval_timeout_seconds": 60})
    assert [(r["origin"], r["index"], r["then"]) for r in pol["rules"]] == [("launch", 1, "deny"), ("profile", 1, "allow")]
    assert (pol["irreversible_approvals"], pol["separate_duties"], pol["approval_timeout_seconds"]) == (3, True, 60)
    assert pol["on_expiry"] == "reject"


# -- through step(): the snapshot, the approval row, grants ---------------------------


@dataclass
class Script:
    decisions: list[ModelReply]

    def propose(self, request: ModelRequest) -> ModelReply:
        return self.decisions[request.turn]


@dataclass
class MemJournal:
    entries: dict[str, JournalEntry] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)

    def get(self, key: str) -> JournalEntry | None:
        return self.entries.get(key)

    def executed(self, fp: str) -> int:
        return self.done.get(fp, 0)

    def begin(self, key: str) -> bool:
        self.entries[key] = JournalEntry("started")
        return True


class Inline:
    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        return ToolOutcome(ok=True, value=spec.func(args, ctx))


def calls(*args_list: dict[str, Any], tool: str = "refund") -> list[ModelReply]:
    return [ModelReply(calls=(ProposedCall(f"c{i}", tool, a),)) for i, a in enumerate(args_list)] + [ModelReply(final="ok")]


def drive(state: RunState, deps: Deps) -> tuple[RunState, list[Any]]:
    transitions = []
    while (outcome := step(state, deps)) is not None:
        state, t = outcome
        if t.journal_result:
            deps.journal.done[t.journal_result["fp"]] = deps.journal.done.get(t.journal_result["fp"], 0) + 1  # type: ignore[attr-defined]
        transitions.append(t)
    return state, transitions


def start(script: list[ModelReply], rules: list[dict[str, Any]], *, risk: str = "write", identical: int = 3,
          **profile: Any) -> tuple[RunState, Deps]:
    state = new_run(
        "r1", limits=Limits(max_identical_calls=identical), now=0.0, task="t",
        policy=snapshot({"rules": rules, **profile}),
    )
    deps = Deps(model=Script(script), registry=Registry([spec(risk=risk)]), journal=MemJournal(), runner=Inline(),
                now=lambda: 1.0)
    return state, deps


def test_the_same_tool_is_allowed_under_the_threshold_and_asks_over_it() -> None:
    rules = [rule("allow", c("amount", "lt", 20), reason="small refunds"),
             rule("ask", reason="refunds of 20 or more need a human")]
    state, deps = start(calls({"amount": 5}, {"amount": 50}), rules)
    state, ts = drive(state, deps)
    assert state.state == "awaiting_approval"
    assert ts[1].detail["verdict"]["action"] == "allow" and ts[1].detail["verdict"]["rule"]["index"] == 1
    assert ts[-1].approval["reason"] == "refunds of 20 or more need a human"
    assert ts[-1].approval["rule"] == {**rules[1], "origin": "profile", "index": 2}
    assert ts[-1].approval["required"] == 1


def test_a_call_grant_lets_the_identical_calls_through() -> None:
    same = {"amount": 50}
    state, deps = start(calls(same, same, same), [rule("ask", reason="every refund asks")])
    state, _ = drive(state, deps)
    state, t = apply_decision(state, "approve", by="rita", remember="call")
    assert t.grant == {"n": 1, "tool": "refund", "fp": fingerprint("refund", same), "by": "rita", "args": same}
    state, ts = drive(state, deps)
    allowed = [x for x in ts if x.detail.get("verdict", {}).get("grant") == 1]
    assert len(allowed) == 2 and state.state == "done"
    assert "grant 1 by rita allows this exact call" in allowed[0].detail["verdict"]["reason"]


def test_a_grant_asks_again_once_revoked() -> None:
    same = {"amount": 50}
    state, deps = start(calls(same, same, same), [rule("ask", reason="every refund asks")])
    state, _ = drive(state, deps)
    state, _t = apply_decision(state, "approve", by="rita", remember="call")
    state, t = step(state, deps)  # type: ignore[misc]  # acting -> planning: the approved call runs
    state, t = step(state, deps)  # type: ignore[misc]  # the model proposes the same call again
    assert t.to_state == "acting" and t.detail["verdict"]["grant"] == 1
    state, t = step(state, deps)  # type: ignore[misc]
    state, revoked = revoke_grant(state, 1, by="olga")
    assert revoked.from_state == revoked.to_state == "planning" and revoked.grant_revoke == 1
    assert state.grants[0]["revoked"] is True
    state, t = step(state, deps)  # type: ignore[misc]
    assert t.to_state == "awaiting_approval" and "grant" not in t.detail["verdict"]
    with pytest.raises(LookupError):
        revoke_grant(state, 1)


def test_a_tool_grant_covers_other_arguments_but_never_taint_or_a_deny_rule() -> None:
    rules = [rule("deny", c("amount", "gt", 1000), reason="never over 1000"), rule("ask", reason="refunds ask")]
    state, deps = start(calls({"amount": 50}, {"amount": 70}, {"amount": 5000}), rules)
    state, _ = drive(state, deps)
    state, _t = apply_decision(state, "approve", by="rita", remember="tool")
    state, ts = drive(state, deps)
    verdicts = [t.detail["verdict"] for t in ts if "verdict" in t.detail]
    assert [(v["action"], v.get("grant")) for v in verdicts] == [("allow", 1), ("deny", None)]
    assert state.state == "done"
    pol = snapshot({"rules": [rule("ask")]})
    g = [{"n": 1, "tool": "refund", "by": "rita"}]
    tainted = policy_verdict(spec(), "refund", denied=[], always_ask=[], tainted=True, approver="human", args=ARGS,
                     policy=pol, grants=g)
    assert tainted.action == "ask" and tainted.grant is None


def test_grants_are_refused_for_irreversible_calls_several_votes_and_tainted_writes() -> None:
    assert policy.grant_refusal(risk="irreversible", required=1, tainted=False)
    assert policy.grant_refusal(risk="write", required=2, tainted=False)
    assert policy.grant_refusal(risk="write", required=1, tainted=True)
    assert policy.grant_refusal(risk="write", required=1, tainted=False, kind="outcome_unknown")
    assert policy.grant_refusal(risk="read", required=1, tainted=True) is None
    assert policy.grant_refusal(risk="write", required=1, tainted=False) is None


def test_the_policy_snapshot_survives_a_json_round_trip() -> None:
    state, _ = start([], [rule("ask", c("note", "eq", None))], approval_timeout_seconds=None)
    # As the store keeps it: engine JSON drops nulls.
    again = RunState.from_json(json.loads(json.dumps(state.engine_json())))
    assert again.policy["rules"][0]["when"] == {"arg": "note", "op": "eq"}
    assert holds(again.policy["rules"][0]["when"], ARGS)  # a null value dropped by the snapshot still means null
