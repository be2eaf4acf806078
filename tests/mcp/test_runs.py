"""Runs that use MCP tools: the same policy, journal, approvals and timeline as built-in
tools, against the example server over stdio and over streamable HTTP."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.models import Approval, McpServer, McpTool, Message, ToolCall
from agents.runs.verify import verify_run
from tests.helpers import call, final
from tests.mcp.conftest import command, stdio_command, stray_children

pytestmark = pytest.mark.django_db(transaction=True)


def tool_results(run) -> list[str]:
    return list(Message.objects.filter(run=run, role="tool").order_by("index").values_list("content", flat=True))


def kinds(run) -> list[str]:
    return list(run.transitions.order_by("seq").values_list("kind", flat=True))


@pytest.fixture
def rita(defaults) -> User:
    from tests.helpers import person

    return person("rita", "reviewer")


@pytest.mark.parametrize("source", ["stdio_server", "http_server"])
def test_read_tool_runs_without_asking(source, request, mcp_launch, drive) -> None:
    server = request.getfixturevalue(source)
    run = drive(mcp_launch(server, [call(f"{server.name}__lookup", record_id="alpha"), final("found it")]))
    assert run.state == "done" and run.answer == "found it"
    assert tool_results(run) == ["the first record"]
    assert not Approval.objects.filter(run=run).exists()
    assert not run.tainted
    entry = ToolCall.objects.get(run=run)
    assert entry.status == "succeeded" and entry.tool == f"{server.name}__lookup"


def test_destructive_tool_waits_for_a_reviewer_and_runs_once_after_approval(
    http_server, mcp_launch, drive, calls, rita
) -> None:
    run = drive(mcp_launch(http_server, [call("web__delete_record", record_id="beta"), final("deleted")]))
    assert run.state == "awaiting_approval"
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.tool == "web__delete_record" and approval.args == {"record_id": "beta"}
    assert approval.risk == "irreversible"
    assert calls() == [], "nothing reaches the server before a human says so"

    first = approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    again = approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    assert first.won and not again.won
    run = drive(run)
    run = drive(run)
    assert run.state == "done" and run.answer == "deleted"
    entry = ToolCall.objects.get(run=run)
    assert entry.status == "succeeded"
    # Exactly one execution, and the server saw Airlock's idempotency key in `_meta`.
    assert calls() == [{"tool": "delete_record", "args": {"record_id": "beta"},
                        "idempotency_key": entry.idempotency_key, "pid": calls()[0]["pid"]}]
    assert tool_results(run) == ["deleted beta"]
    assert verify_run(run) == []


def test_open_world_tool_taints_the_run_and_a_write_then_asks(stdio_server, mcp_launch, drive, calls) -> None:
    run = drive(mcp_launch(stdio_server, [
        call("files__web_search", query="refund policy"),
        call("files__add_tag", record_id="alpha", tag="seen"),
        final(),
    ]))
    assert run.tainted
    assert run.state == "awaiting_approval"
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.tool == "files__add_tag"
    assert approval.taint_source["tool"] == "files__web_search"
    assert calls() == []


def test_write_tool_in_a_clean_run_runs_without_asking(stdio_server, mcp_launch, drive, calls) -> None:
    run = drive(mcp_launch(stdio_server, [call("files__add_tag", record_id="alpha", tag="seen"), final()]))
    assert run.state == "done"
    assert [c["tool"] for c in calls()] == ["add_tag"]
    assert calls()[0]["idempotency_key"] == ToolCall.objects.get(run=run).idempotency_key


def test_unannotated_tool_always_asks(stdio_server, mcp_launch, drive) -> None:
    run = drive(mcp_launch(stdio_server, [call("files__mystery", value=1), final()]))
    assert run.state == "awaiting_approval"
    assert Approval.objects.get(run=run).risk == "irreversible"


def test_an_override_is_the_only_way_to_a_less_guarded_tool(stdio_server, mcp_launch, drive) -> None:
    McpTool.objects.filter(name="files__mystery").update(risk_override="read", returns_override="internal")
    run = drive(mcp_launch(stdio_server, [call("files__mystery", value=7), final("ok")]))
    assert run.state == "done" and tool_results(run) == ["mystery(7)"]
    assert not run.tainted


def test_arguments_are_validated_against_the_servers_schema_before_any_call(
    stdio_server, mcp_launch, drive, calls
) -> None:
    run = drive(mcp_launch(stdio_server, [call("files__add_tag", record_id="alpha"), final()]))
    assert run.state == "done"
    result = json.loads(tool_results(run)[0])
    assert result["error"] == "invalid_arguments" and "'tag' is a required property" in result["detail"]
    assert calls() == [] and not ToolCall.objects.filter(run=run).exists()


def test_is_error_result_becomes_a_tool_error(http_server, mcp_launch, drive) -> None:
    run = drive(mcp_launch(http_server, [call("web__broken", reason="disk full"), final("gave up")]))
    assert run.state == "done"
    result = json.loads(tool_results(run)[0])
    assert result["ok"] is False and result["error"] == "tool_error" and "disk full" in result["detail"]
    assert ToolCall.objects.get(run=run).status == "failed"


def test_timeout_is_a_recorded_error_and_the_stdio_server_is_gone(stdio_server, mcp_launch, drive, calls) -> None:
    # Long enough for the server to start on a busy machine: the timeout must cut the call itself.
    McpTool.objects.filter(name="files__slow").update(timeout_seconds=8)
    run = drive(mcp_launch(stdio_server, [call("files__slow", seconds=600), final("moved on")]))
    assert run.state == "done"
    assert [c["tool"] for c in calls()] == ["slow"], "the call had reached the server"
    result = json.loads(tool_results(run)[0])
    assert result == {"ok": False, "error": "timeout", "detail": "slow did not finish within 8 s"}
    assert stray_children() == []


def test_stdio_calls_leave_no_process_behind(stdio_server, mcp_launch, drive) -> None:
    run = drive(mcp_launch(stdio_server, [
        call("files__lookup", record_id="alpha"), call("files__broken"), call("files__lookup", record_id="beta"),
        final(),
    ]))
    assert run.state == "done"
    assert stray_children() == []


@pytest.mark.parametrize("source", ["stdio_server", "http_server"])
def test_server_dying_mid_call_on_an_unsafe_tool_is_outcome_unknown(
    source, request, mcp_launch, drive, calls, rita
) -> None:
    server = request.getfixturevalue(source)
    tool = f"{server.name}__charge_card"
    McpTool.objects.filter(name=tool).update(risk_override="write")  # let it run without asking first
    run = drive(mcp_launch(server, [call(tool, amount=12), final("charged")]))
    assert run.state == "awaiting_approval"
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "outcome_unknown"
    assert approval.reason.startswith(f"outcome unknown: {tool} failed mid-call")
    assert [c["tool"] for c in calls()] == ["charge_card"], "the call reached the server before it died"
    entry = ToolCall.objects.get(run=run)
    assert entry.status == "started" and entry.result is None
    assert kinds(run)[-1] == "outcome_unknown"

    approval_decide(approval_id=approval.pk, user=rita, decision="happened", note="the card was charged")
    run = drive(run)
    assert run.state == "done" and run.answer == "charged"
    assert ToolCall.objects.get(run=run).status == "succeeded"
    assert len(calls()) == 1
    assert verify_run(run) == []
    if source == "stdio_server":
        assert stray_children() == []


def test_dead_http_server_is_a_recorded_error_for_a_safe_tool(
    defaults, calls, http, mcp_launch, drive
) -> None:
    server_proc = http(calls)
    command("add_mcp_server", "web", "--url", server_proc.start())
    command("mcp_sync", "web")
    server_proc.stop()
    run = drive(mcp_launch(McpServer.objects.get(name="web"), [call("web__lookup", record_id="alpha"), final("no")]))
    assert run.state == "done"
    result = json.loads(tool_results(run)[0])
    assert result["ok"] is False and result["error"] == "mcp_transport_error"
    assert "server web" in result["detail"]


def test_a_run_never_calls_a_tool_whose_definition_changed_under_it(
    stdio_server, calls, mcp_launch, drive
) -> None:
    # The server was upgraded after the last sync: the pinned definition no longer holds.
    McpServer.objects.filter(pk=stdio_server.pk).update(command=stdio_command(calls, "--variant", "2"))
    run = drive(mcp_launch(stdio_server, [
        call("files__lookup", record_id="alpha"), call("files__lookup", record_id="beta"), final(),
    ]))
    results = [json.loads(r) for r in tool_results(run)]
    assert [r["error"] for r in results] == ["definition_changed", "definition_changed"]
    assert "disabled until an operator accepts it" in results[0]["detail"]
    tool = McpTool.objects.get(name="files__lookup")
    assert tool.status == "changed" and "audit@example.com" in tool.pending_definition["description"]
    # Disabled from then on: a later run is not even offered the tool.
    later = drive(mcp_launch(stdio_server, [call("files__lookup", record_id="alpha"), final()]))
    assert json.loads(tool_results(later)[0])["error"] == "unknown_tool"


@pytest.mark.parametrize(("retry", "starts"), [("safe", 3), ("unsafe", 1)])
def test_transport_failures_are_retried_a_bounded_number_of_times_only_for_safe_tools(
    retry, starts, stdio_server, mcp_launch, drive, tmp_path
) -> None:
    started = tmp_path / "starts"
    # The server's command now dies at once, counting each start.
    McpServer.objects.filter(pk=stdio_server.pk).update(command=f"sh -c 'echo start >> {started}; exit 1'")
    McpTool.objects.filter(name="files__add_tag").update(retry_safety_override=retry)
    run = drive(mcp_launch(stdio_server, [call("files__add_tag", record_id="a", tag="b"), final("gave up")]))
    assert run.state == "done"
    result = json.loads(tool_results(run)[0])
    assert result["ok"] is False and result["error"] == "mcp_transport_error"
    assert started.read_text().count("start") == starts
    assert stray_children() == []


def test_timeout_of_an_unsafe_call_already_sent_is_outcome_unknown(stdio_server, mcp_launch, drive, calls) -> None:
    McpTool.objects.filter(name="files__slow").update(timeout_seconds=8, retry_safety_override="unsafe")
    run = drive(mcp_launch(stdio_server, [call("files__slow", seconds=600), final()]))
    assert [c["tool"] for c in calls()] == ["slow"]
    assert run.state == "awaiting_approval", tool_results(run)
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "outcome_unknown"
    assert "files__slow failed mid-call (slow did not finish within 8 s)" in approval.reason
    assert stray_children() == []


def test_after_an_http_server_restarts_the_next_call_runs_on_a_new_session(
    defaults, calls, http, mcp_launch, drive
) -> None:
    """Sessions to HTTP servers stay open between calls. When the server restarts at the
    same URL, the kept session is dead (its stream ended, or the server answers it 404):
    the next call of an unsafe tool runs on a new session, and nothing becomes "outcome
    unknown" for a call the old session never delivered."""
    first = http(calls)
    url = first.start()
    command("add_mcp_server", "web", "--url", url)
    command("mcp_sync", "web")
    McpTool.objects.filter(name="web__lookup").update(retry_safety_override="unsafe")
    server = McpServer.objects.get(name="web")
    before = drive(mcp_launch(server, [call("web__lookup", record_id="alpha"), final("one")]))
    assert tool_results(before) == ["the first record"]
    first.stop()
    http(calls).start("--port", url.rsplit(":", 1)[1].split("/")[0])
    after = drive(mcp_launch(server, [call("web__lookup", record_id="beta"), final("two")]))
    assert after.state == "done" and tool_results(after) == ["the second record"]
    assert not Approval.objects.filter(run=after).exists()
