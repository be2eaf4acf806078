"""History rules in the pure engine: validation, the queries a call asks, the judgement
on the figures handed in, fail-closed, shadow rules and the reviewer's figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agents.engine import history
from agents.engine.history import Figures, Query
from agents.engine.policy import PolicyError, snapshot, validate_rules
from agents.engine.policy import verdict as policy_verdict
from agents.engine.registry import ToolSpec

REFUND = ToolSpec(name="refund", description="", schema={"type": "object"}, risk="write", returns="internal", retry_safety="safe", func=lambda a, c: None)
EMAIL = ToolSpec(name="send_email", description="", schema={"type": "object"}, risk="write", returns="internal", retry_safety="safe", func=lambda a, c: None)

THIRD = {"tool": "refund", "then": "ask", "reason": "a third refund of one order in a day",
         "history": {"within": "24h", "scope": "profile", "same": ["order_id"], "calls_over": 2}}
OVER_500 = {"tool": "refund", "then": "ask", "reason": "over 500 EUR to one customer this week",
            "history": {"within": "7d", "scope": "project", "same": ["customer"], "sum_over": {"amount": 500}}}
AFTER_EXPORT = {"tool": "send_email", "then": "ask", "reason": "writes after reading a customer export",
                "history": {"scope": "run", "after": ["export_customers", "crm__*"]}}
RUNAWAY = {"tool": "*", "then": "deny", "reason": "runaway client",
           "history": {"within": "1h", "scope": "caller", "calls_over": 200}}


class Canned:
    """A history provider answering from given figures, recording what it was asked."""

    def __init__(self, figures: Figures | None = None) -> None:
        self.answer = figures or Figures()
        self.asked: list[list[Query]] = []

    def __call__(self, queries: Sequence[Query]) -> list[Figures]:
        self.asked.append(list(queries))
        return [self.answer for _ in queries]


def judge(rules: list[dict[str, Any]], tool: str, args: Any, figures: Figures | None = None, **kw: Any) -> Any:
    canned = Canned(figures)
    spec = REFUND if tool == "refund" else EMAIL
    v = policy_verdict(
        spec, tool, denied=[], always_ask=[], tainted=False, approver="human", args=args,
        policy=snapshot({"rules": rules}), history=kw.pop("history", canned), **kw,
    )
    return v, canned


# -- validation -------------------------------------------------------------------------


def test_the_four_example_rules_are_valid() -> None:
    assert [r["history"] for r in validate_rules([THIRD, OVER_500, AFTER_EXPORT, RUNAWAY])] == [
        r["history"] for r in (THIRD, OVER_500, AFTER_EXPORT, RUNAWAY)
    ]


@pytest.mark.parametrize(
    "bad, field",
    [
        ("24h", "rules[1].history"),
        ({"scope": "team", "within": "1h", "calls_over": 1}, "rules[1].history.scope"),
        ({"scope": "profile", "calls_over": 1}, "rules[1].history.within"),  # only a run scope may leave it out
        ({"scope": "run", "within": "1w", "calls_over": 1}, "rules[1].history.within"),
        ({"scope": "run", "within": "400d", "calls_over": 1}, "rules[1].history.within"),
        ({"scope": "run"}, "rules[1].history"),  # no test
        ({"scope": "run", "calls_over": 1, "after": ["x"]}, "rules[1].history"),  # two tests
        ({"scope": "run", "calls_over": -1}, "rules[1].history.calls_over"),
        ({"scope": "run", "calls_over": True}, "rules[1].history.calls_over"),
        ({"scope": "run", "sum_over": {"amount": "500"}}, "rules[1].history.sum_over.amount"),
        ({"scope": "run", "sum_over": {"a": 1, "b": 2}}, "rules[1].history.sum_over"),
        ({"scope": "run", "calls_over": 1, "same": []}, "rules[1].history.same"),
        ({"scope": "run", "calls_over": 1, "same": ["a..b"]}, "rules[1].history.same[1]"),
        ({"scope": "run", "after": ["*"]}, "rules[1].history.after[1]"),
        ({"scope": "run", "calls_over": 1, "of": ["crm*"]}, "rules[1].history.of[1]"),
        ({"scope": "run", "calls_over": 1, "every": "1h"}, "rules[1].history.every"),
    ],
)
def test_a_bad_history_names_its_field(bad: Any, field: str) -> None:
    with pytest.raises(PolicyError) as e:
        validate_rules([{"tool": "refund", "then": "ask", "reason": "r", "history": bad}])
    assert e.value.field == field


def test_a_launch_may_add_history_rules_that_ask_or_deny_only() -> None:
    pol = snapshot({}, {"rules": [THIRD]})
    assert pol["rules"][0]["history"] == THIRD["history"]
    with pytest.raises(PolicyError) as e:
        snapshot({}, {"rules": [{**THIRD, "then": "allow"}]})
    assert e.value.field == "policy.rules[1].then"


# -- the queries a call asks -------------------------------------------------------------


def test_calls_over_asks_for_the_rules_tool_with_the_same_value_and_counts_one_past_the_limit() -> None:
    _, canned = judge([THIRD], "refund", {"order_id": "1042", "amount": 30})
    (q,) = canned.asked[0]
    assert (q.scope, q.window, q.tools, q.same, q.count_to) == ("profile", 86400, ("refund",), (("order_id", '"1042"'),), 3)


def test_all_history_rules_of_a_call_are_asked_in_one_batch_and_others_not_at_all() -> None:
    _, canned = judge([THIRD, OVER_500, AFTER_EXPORT, RUNAWAY], "refund", {"order_id": "1", "customer": "c", "amount": 1})
    assert len(canned.asked) == 1
    assert [q.scope for q in canned.asked[0]] == ["profile", "project", "caller"]  # not send_email's rule
    assert canned.asked[0][2].tools == ()  # "*": every tool


def test_of_counts_other_tools_and_after_asks_whether_they_ran() -> None:
    rule = {**THIRD, "history": {"scope": "run", "calls_over": 0, "of": ["export_customers"]}}
    _, canned = judge([rule], "refund", {"order_id": "1"})
    assert canned.asked[0][0].tools == ("export_customers",)
    _, canned = judge([AFTER_EXPORT], "send_email", {"to": "x"})
    (q,) = canned.asked[0]
    assert (q.tools, q.ran, q.window) == (("export_customers", "crm__*"), True, None)


def test_a_rule_whose_when_does_not_match_asks_nothing() -> None:
    rule = {**THIRD, "when": {"arg": "amount", "op": "gt", "value": 100}}
    v, canned = judge([rule], "refund", {"order_id": "1", "amount": 5}, Figures(count=99))
    assert canned.asked == [] and v.action == "allow"


# -- the judgement ------------------------------------------------------------------------


@pytest.mark.parametrize("earlier, action", [(0, "allow"), (1, "allow"), (2, "ask"), (3, "ask")])
def test_calls_over_catches_the_n_plus_first_call(earlier: int, action: str) -> None:
    v, _ = judge([THIRD], "refund", {"order_id": "1042"}, Figures(count=earlier))
    assert v.action == action


@pytest.mark.parametrize("total, amount, action", [(470, 30, "allow"), (470, 31, "ask"), (0, 501, "ask"), (0, 500, "allow")])
def test_sum_over_adds_this_calls_value_to_the_earlier_sum(total: float, amount: float, action: str) -> None:
    v, _ = judge([OVER_500], "refund", {"customer": "c9", "amount": amount}, Figures(total=total))
    assert v.action == action


def test_after_holds_once_one_of_the_tools_ran() -> None:
    assert judge([AFTER_EXPORT], "send_email", {}, Figures())[0].action == "allow"
    v, _ = judge([AFTER_EXPORT], "send_email", {}, Figures(ran="crm__search"))
    assert v.action == "ask"
    assert v.history["ran"] == "crm__search"
    assert v.reason == "writes after reading a customer export: after crm__search ran in this run"


def test_a_deny_history_rule_denies_the_runaway_client() -> None:
    v, _ = judge([RUNAWAY], "refund", {"order_id": "1"}, Figures(count=200))
    assert (v.action, v.reason) == ("deny", "runaway client: the 201st call in 1 h by this caller (over 200)")
    v, _ = judge([RUNAWAY], "refund", {"order_id": "1"}, Figures(count=201))  # counted no further than 201
    assert v.history["text"] == "at least the 202nd call in 1 h by this caller (over 200)"


def test_the_reviewer_reads_the_figures_in_numbers() -> None:
    v, _ = judge([THIRD], "refund", {"order_id": "1042"}, Figures(count=2))
    assert v.reason == "a third refund of one order in a day: the 3rd refund call with order_id 1042 in 24 h (over 2)"
    assert v.history == {
        "scope": "profile", "within": "24h", "tools": ["refund"], "same": {"order_id": "1042"},
        "count": 2, "calls_over": 2, "total": None, "sum_over": None, "ran": None,
        "text": "the 3rd refund call with order_id 1042 in 24 h (over 2)",
    }
    assert v.to_dict()["history"] == v.history
    v, _ = judge([{**OVER_500, "history": {**OVER_500["history"], "sum_over": {"amount": 30}}}], "refund",
                 {"customer": "1042", "amount": 12.5}, Figures(total=23.5))
    assert v.history["total"] == 36.0
    assert "36.00 amount in refund calls with customer 1042 in 7 d in this project, this one included (over 30)" in v.reason


@pytest.mark.parametrize("args", [{"amount": 10}, {"order_id": None}, "not an object"])
def test_a_call_without_the_same_value_fails_closed(args: Any) -> None:
    ask, _ = judge([THIRD], "refund", args)
    assert ask.action == "ask" and "fails closed" in ask.reason
    allow_rule = {**THIRD, "then": "allow"}
    v, _ = judge([allow_rule], "refund", args)
    assert v.rule is None  # an allow rule does not match what cannot be evaluated


def test_without_a_history_provider_history_rules_fail_closed() -> None:
    v, _ = judge([THIRD, {**THIRD, "then": "allow", "reason": "fine"}], "refund", {"order_id": "1"}, history=None)
    assert v.action == "ask" and v.rule["index"] == 1
    v, _ = judge([{**THIRD, "then": "allow", "reason": "fine"}], "refund", {"order_id": "1"}, history=None)
    assert v.rule is None


def test_a_shadow_history_rule_records_what_it_would_have_decided() -> None:
    v, _ = judge([{**THIRD, "mode": "shadow"}], "refund", {"order_id": "1042"}, Figures(count=5))
    assert v.action == "allow" and v.shadow == ({"rule": 1, "verdict": "ask"},)
    v, _ = judge([{**THIRD, "mode": "shadow"}], "refund", {"order_id": "1042"}, Figures(count=1))
    assert v.shadow == ()


def test_a_shadow_history_rule_that_allows_is_judged_in_place_with_its_own_figures() -> None:
    """Promoted in its place, a shadow rule is the same rule with the same figures: an
    allow rule whose history holds would have allowed the call a human is asked about
    (without its figures it would fail closed and match nothing)."""
    after = {"tool": "refund", "then": "allow", "reason": "refunds after a lookup", "mode": "shadow",
             "history": {"scope": "run", "after": ["crm__lookup"]}}
    asks = {"tool": "refund", "then": "ask", "reason": "refunds ask"}
    v, canned = judge([after, asks], "refund", {"order_id": "1042"}, Figures(ran="crm__lookup"))
    assert (v.action, v.shadow) == ("ask", ({"rule": 1, "verdict": "allow"},))
    assert len(canned.asked) == 1


def test_lock_keys_follow_the_counted_calls_not_the_window() -> None:
    q = history.Query(scope="profile", window=60, tools=("refund",), same=(("order_id", '"1"'),), count_to=3)
    assert q.lock_key() == history.Query(scope="profile", window=3600, tools=("refund",), same=(("order_id", '"1"'),),
                                          sum_path="amount").lock_key()
    assert q.lock_key() != history.Query(scope="profile", window=60, tools=("refund",), same=(("order_id", '"2"'),)).lock_key()
    assert history.Query(scope="run", window=None, tools=()).lock_key() is None
    assert 0 <= (q.lock_key() or 0) < 2**63


def test_value_at_reads_as_postgresql_does() -> None:
    args = {"items": [{"sku": "A"}], "order": {"id": 7}}
    assert history.value_at(args, "items.0.sku") == (True, "A")
    assert history.value_at(args, "items.sku") == (False, None)  # no fan-out
    assert history.value_at(args, "order.id") == (True, 7)


def test_a_long_reason_gives_way_to_the_figures() -> None:
    long = {**THIRD, "reason": "x" * 200}
    v, _ = judge([long], "refund", {"order_id": "1042"}, Figures(count=2))
    assert len(v.reason) <= 200 and v.reason.endswith(": the 3rd refund call with order_id 1042 in 24 h (over 2)")
