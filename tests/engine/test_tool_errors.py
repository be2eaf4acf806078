"""A tool's own failures in the pure engine: named errors, and a failure whose outcome
is unknown (the request left before the far side died), plain data, no database."""

from __future__ import annotations

from typing import Any

from agents.engine.limits import Limits
from agents.engine.protocols import Deps, ModelReply, ModelRequest, ProposedCall
from agents.engine.registry import Registry, ToolContext, ToolError, ToolSpec
from agents.engine.run import Move, RunState, new_run
from agents.engine.step import step
from tests.engine.harness import BlankJournal


class OneCall:
    def propose(self, request: ModelRequest) -> ModelReply:
        return ModelReply(calls=(ProposedCall("c1", "charge", {"amount": 5}),))


def died_mid_call(args: dict[str, Any], ctx: ToolContext) -> Any:
    raise ToolError("mcp_transport_error", "connection closed", outcome_unknown=True)


def advance_to_rest(retry_safety: str) -> tuple[RunState, list[Move]]:
    spec = ToolSpec("charge", "", {"type": "object"}, "write", "internal", retry_safety, died_mid_call)  # type: ignore[arg-type]
    deps = Deps(model=OneCall(), registry=Registry([spec]), journal=BlankJournal())
    state = new_run("1", limits=Limits.from_dict({}), now=0.0, task="t")
    deps.now = lambda: 1.0
    transitions = []
    for _ in range(4):
        outcome = step(state, deps)
        if outcome is None:
            break
        state, t = outcome
        transitions.append(t)
        if state.state == "planning" and t.kind == "tool":
            break
    return state, transitions


def test_unsafe_tool_whose_outcome_is_unknown_waits_for_a_human() -> None:
    state, transitions = advance_to_rest("unsafe")
    assert state.state == "awaiting_approval"
    last = transitions[-1]
    assert last.kind == "outcome_unknown" and last.journal_result is None
    assert last.approval is not None and last.approval["kind"] == "outcome_unknown"
    assert last.approval["reason"] == (
        "outcome unknown: charge failed mid-call (connection closed) and is not safe to repeat"
    )


def test_safe_tool_whose_outcome_is_unknown_is_an_error_result() -> None:
    state, transitions = advance_to_rest("safe")
    assert state.state == "planning"
    result = transitions[-1].journal_result
    assert result is not None and result["result"] == {
        "ok": False, "error": "mcp_transport_error", "detail": "connection closed",
    }


def test_expand_offers_every_tool_of_a_prefix() -> None:
    def spec(name: str) -> ToolSpec:
        return ToolSpec(name, "", {"type": "object"}, "read", "internal", "safe", lambda a, c: None)

    reg = Registry([spec("echo"), spec("files__read"), spec("files__write"), spec("web__get")])
    assert reg.expand(["files__*", "echo", "files__read", "gone__*"]) == ["files__read", "files__write", "echo"]
    assert reg.expand(None) is None
