from __future__ import annotations

from agents.engine.policy import verdict as policy_verdict
from agents.engine.registry import ToolSpec


def spec(risk: str, returns: str = "internal") -> ToolSpec:
    return ToolSpec("t", "", {"type": "object"}, risk, returns, "safe", lambda a, c: None)  # type: ignore[arg-type]


def verdict(s: ToolSpec | None, **kw: object) -> str:
    args = {"denied": [], "always_ask": [], "tainted": False, "approver": "human", **kw}
    return policy_verdict(s, "t", **args).action  # type: ignore[arg-type]


def test_verdicts_follow_the_designs_order() -> None:
    assert verdict(spec("read")) == "allow"
    assert verdict(spec("read"), denied=["t"]) == "deny"
    assert verdict(spec("irreversible"), denied=["t"]) == "deny"
    assert verdict(spec("irreversible")) == "ask"
    assert verdict(spec("read"), always_ask=["t"]) == "ask"
    assert verdict(spec("write")) == "allow"
    assert verdict(spec("write"), tainted=True) == "ask"
    assert verdict(spec("read"), tainted=True) == "allow"


def test_unknown_tool_counts_as_irreversible() -> None:
    assert verdict(None) == "ask"


def test_ask_becomes_deny_without_an_approver() -> None:
    v = policy_verdict(spec("irreversible"), "t", denied=[], always_ask=[], tainted=False, approver="none")
    assert v.action == "deny" and v.no_approver and "no approver" in v.reason
