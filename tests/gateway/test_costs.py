"""What one gateway call reads: the guards of the cuts in docs/gateway.md ("What a
call costs"), each counting the queries that the cut removed."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.gateway import core
from agents.lib import rows
from agents.models import McpServer, McpTool, ToolCall
from agents.tools import mcp as mcp_tools
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


def _opened(token: str) -> tuple[core.Caller, str]:
    admitted = core.admit(f"Bearer {token}", "gw", sid=None, run_header=None, opening=True,
                          client_name="cost test", protocol_version="2025-06-18")
    assert admitted.sid is not None
    return admitted.caller, admitted.sid


def _call(token: str, sid: str, tool: str, args: dict[str, Any]) -> Any:
    admitted = core.admit(f"Bearer {token}", "gw", sid=sid, run_header=None, opening=False,
                          client_name="", protocol_version="")
    started = core.call_start(admitted, tool, args)
    assert not isinstance(started, core.Reply), started
    answer, run_id = started
    return core.reply(answer, run_id)


def _mcp_tool_reads(captured: CaptureQueriesContext) -> int:
    return sum(1 for q in captured.captured_queries if q["sql"] and 'FROM "agents_mcptool"' in q["sql"])


def test_an_allowed_call_reads_the_offered_mcp_tools_once(gw, upstream, token) -> None:
    _caller, sid = _opened(token)
    _call(token, sid, "web__lookup", {"record_id": "alpha"})  # the session's first call launches its run
    with CaptureQueriesContext(connection) as captured:
        reply = _call(token, sid, "web__lookup", {"record_id": "beta"})
    assert not reply.is_error and reply.text == "the second record"
    # The offered-tools check, the policy's registry and the drive: one read between them.
    assert _mcp_tool_reads(captured) == 1
    assert ToolCall.objects.filter(tool="web__lookup", status="succeeded").count() == 2


def test_a_call_reads_only_its_profiles_mcp_tools(gw, upstream, token, monkeypatch) -> None:
    # Another server's 60 tools, offered to other profiles: a gateway call of `gw`
    # (`web__*`) reads none of their rows, so it costs the same however many there are.
    other = McpServer.objects.create(name="other", transport="http", url="http://127.0.0.1:9/mcp")
    McpTool.objects.bulk_create([
        McpTool(server=other, mcp_name=f"t{i}", name=f"other__t{i}", description="t", input_schema={"type": "object"},
                sha256="0" * 64)
        for i in range(60)
    ])
    web = set(McpTool.objects.filter(server__name="web").values_list("pk", flat=True))
    read: list[int] = []
    real = rows.fetch

    def counting(sql: str, params: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        found = real(sql, params, **kwargs)
        if 'agents_apitoken' in sql and 'FROM "agents_mcptool"' in sql:
            # The marks read beside the token (core.authenticate): its last column.
            read.extend(pk for row in found[:1] for pk, _mark in mcp_tools.marks_read(row[-1]))
        elif 'FROM "agents_mcptool"' in sql:
            read.extend(row[0] for row in found)
        return found

    monkeypatch.setattr(rows, "fetch", counting)
    caller, sid = _opened(token)
    assert {t["name"] for t in core.tool_list(caller)} >= {"web__lookup", "web__delete_record"}
    _call(token, sid, "web__lookup", {"record_id": "alpha"})
    reply = _call(token, sid, "web__lookup", {"record_id": "beta"})
    assert not reply.is_error and reply.text == "the second record"
    assert read and set(read) <= web


def _transcript_reads(captured: CaptureQueriesContext) -> int:
    return sum(1 for q in captured.captured_queries if q["sql"] and 'FROM "agents_message"' in q["sql"])


@pytest.mark.parametrize("cache, reads", [(20000, 0), (0, 1)], ids=["cached", "uncached"])
def test_an_allowed_call_reads_its_transcript_at_most_once(gw, upstream, token, settings, cache, reads) -> None:
    settings.AIRLOCK_TRANSCRIPT_CACHE = cache
    _caller, sid = _opened(token)
    _call(token, sid, "web__lookup", {"record_id": "alpha"})
    with CaptureQueriesContext(connection) as captured:
        reply = _call(token, sid, "web__lookup", {"record_id": "gamma"})
    assert not reply.is_error
    assert ToolCall.objects.filter(tool="web__lookup", status="succeeded").count() == 2
    # Cached, the transcript the last call's commit wrote is this process's at the
    # run's version (agents/runs/store.py). Either way the drive that runs the call is
    # handed the state the proposal committed instead of loading it again.
    assert _transcript_reads(captured) == reads


def _journal_reads(captured: CaptureQueriesContext) -> int:
    return sum(1 for q in captured.captured_queries if q["sql"] and '"agents_toolcall"."idempotency_key" =' in q["sql"])


def test_an_allowed_call_does_not_read_back_the_intent_its_proposal_wrote(gw, upstream, token) -> None:
    _caller, sid = _opened(token)
    _call(token, sid, "web__lookup", {"record_id": "alpha"})
    with CaptureQueriesContext(connection) as captured:
        reply = _call(token, sid, "web__lookup", {"record_id": "beta"})
    assert not reply.is_error and reply.text == "the second record"
    # The proposal's commit wrote the call's intent and took the run's lease, so the
    # drive that runs the call knows its journal entry without reading it.
    assert _journal_reads(captured) == 0
    assert ToolCall.objects.filter(tool="web__lookup", status="succeeded").count() == 2
