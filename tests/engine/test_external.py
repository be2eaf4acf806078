"""The engine with decisions from outside (an external agent's client): it rests where
a model's run would call the model or run the tool, and records the client's result."""

from __future__ import annotations

import pytest

from agents.engine.acting import report
from agents.engine.protocols import ModelReply, ProposedCall, ToolOutcome
from agents.engine.registry import ClientToolError, client_tool_specs
from agents.llm.external import ExternalClient
from tests.engine.harness import launch

CRM = {"name": "crm_update", "description": "CRM", "schema": {"type": "object"}, "risk": "write",
       "returns": "external", "retry_safety": "unsafe"}


def external(**kwargs):
    run = launch([], **kwargs)
    run.deps.model = ExternalClient()
    for spec in client_tool_specs([CRM]):
        run.deps.registry.add(spec)
    return run


def propose(run, tool: str, **args):
    run.deps.model = ExternalClient(ModelReply(calls=(ProposedCall(id=f"ext_{run.state.model_calls}", tool=tool, args=args),)))
    return run.drive()


def test_without_a_decision_the_run_rests_in_planning() -> None:
    run = external().drive()
    assert run.state.state == "planning" and run.edges() == [("queued", "planning", "pickup")]


def test_a_client_tool_rests_in_acting_and_the_report_is_its_result() -> None:
    run = propose(external(), "crm_update", customer="A")
    assert run.state.state == "acting" and run.state.current_call["client"] is True
    after, t = report(run.state, run.deps.registry.get("crm_update"), ToolOutcome(ok=True, value="saved"))
    run.commit(t, after)
    assert (t.from_state, t.to_state, t.kind) == ("acting", "planning", "tool")
    assert run.state.tainted is True and run.state.steps == 2  # the tool returns external content
    assert run.journal.rows[t.journal_result["key"]]["status"] == "succeeded"
    with pytest.raises(ValueError):
        report(run.state, None, ToolOutcome(ok=True))


def test_a_registry_tool_of_an_external_run_runs_and_the_run_rests_after() -> None:
    run = propose(external(), "echo", text="hi")
    assert run.state.state == "planning"
    assert [e[2] for e in run.edges()] == ["pickup", "model", "tool"]


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ({"tools": 1}, "client_tools must be a list"),
        ([{**CRM, "name": "mcp__x"}], "client_tools[0].name"),
        ([CRM, CRM], "declared twice"),
        ([{**CRM, "returns": "web"}], "client_tools[0].returns must be one of internal, external"),
        ([{**CRM, "schema": {"type": "array"}}], 'client_tools[0].schema must be a JSON Schema object'),
        ([{**CRM, "extra": 1}], "unknown key(s) extra"),
    ],
)
def test_client_tools_that_do_not_have_the_documented_shape_are_refused(tools, message) -> None:
    with pytest.raises(ClientToolError) as err:
        client_tool_specs(tools)
    assert message in str(err.value)
