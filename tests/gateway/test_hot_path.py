"""The hot path's cuts keep their guarantees (docs/performance.md, "The hot path"): an
allowed call of a retry-safe tool is marked delivered by its result's own commit (one
durable commit fewer); an unsafe tool's mark stays a commit of its own after that one,
so a process that dies in between leaves a retry answered from the journal. Either
way the next identical call is a new intent, and the intent row is durable before the
upstream is called."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import ClientCall, McpTool, ToolCall
from tests.gateway.conftest import mcp_session, text
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]
LOOKUP = ("web__lookup", {"record_id": "alpha"})


def twice(live_server: Any, token: str) -> tuple[Any, Any]:
    async def go(client: Any) -> tuple[Any, Any]:
        return await client.call_tool(*LOOKUP), await client.call_tool(*LOOKUP)

    return mcp_session(f"{live_server.url}/mcp/gw/", token, go)


@pytest.mark.parametrize("retry", ["safe", "unsafe"])
def test_an_answered_call_is_delivered_once_and_its_twin_runs_anew(
    live_server: Any, gw, upstream, token, retry: str
) -> None:
    McpTool.objects.filter(name="web__lookup").update(retry_safety_override=retry)
    first, second = twice(live_server, token)
    assert not first.is_error and not second.is_error, (text(first), text(second))
    # Delivered, each: the identical second call was a new intent, run again (its own
    # journal entry), not answered from the first's.
    calls = list(ClientCall.objects.order_by("id"))
    entries = list(ToolCall.objects.order_by("id"))
    assert len(calls) == len(entries) == 2
    for call, entry in zip(calls, entries, strict=True):
        assert entry.status == "succeeded" and call.key == entry.idempotency_key
        assert call.delivered_at is not None
        if retry == "safe":
            # Written by the result's commit: the same statement's moment.
            assert call.delivered_at == entry.finished_at
        else:
            # A commit of its own, after the result's: a retry after a death between
            # the two is answered from the journal, not run again.
            assert call.delivered_at > entry.finished_at


def test_the_token_profile_and_stream_are_one_statement_and_refuse_in_their_order(gw, upstream, lena) -> None:
    """A tools/call reads the token, its user's roles, the profile and the caller's
    stream in one round trip; the refusals keep their order (a bad token is 401 before
    a bad conversation key's 400, an unknown profile 404), and a stream's run that ended
    is read afresh for the call's second attempt."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agents.actions.tokens import token_create
    from agents.gateway import core
    from agents.models import GatewayStream, Run

    _t, raw = token_create(user=lena)
    header = f"Bearer {raw}"
    _first, started = core.admit_and_start(header, "gw", sid=None, run_header=None, tool=LOOKUP[0], args=LOOKUP[1],
                                           modern=True)
    assert not isinstance(started, core.Reply) and started[0].status == "succeeded"
    stream_run = started[1]
    with CaptureQueriesContext(connection) as seen:
        admitted, started = core.admit_and_start(header, "gw", sid=None, run_header=None, tool=LOOKUP[0],
                                                 args={"record_id": "beta"}, modern=True)
    assert not isinstance(started, core.Reply) and started[1] == stream_run  # the stream's run, as read beside the token
    assert admitted.caller.stream == ("", (stream_run, "planning", admitted.caller.stream[1][2]))
    sql = [q["sql"] for q in seen.captured_queries]
    assert "agents_gatewaystream" in sql[0] and "agents_agentprofile" in sql[0] and "agents_apitoken" in sql[0]
    assert not [s for s in sql[1:] if "agents_gatewaystream" in s or "agents_apitoken" in s], sql

    # The stream's run ended after the token's statement read it: the call's second
    # attempt reads the stream afresh and continues in a new run.
    stale = core.admit(header, "gw", sid=None, run_header=None, opening=False, client_name="", protocol_version="",
                       modern=True)
    Run.objects.filter(pk=started[1]).update(state="failed")
    again = core.call_start(stale, *LOOKUP)
    assert not isinstance(again, core.Reply), again.text
    assert again[1] != started[1] and GatewayStream.objects.get().run_id == again[1]

    bad_key = "x" * (core.KEY_MAX + 1)
    with pytest.raises(core.Refused) as refused:
        core.admit("Bearer nope", "gw", sid=None, run_header=None, opening=False, client_name="",
                   protocol_version="", modern=True, conversation=bad_key)
    assert refused.value.status == 401
    with pytest.raises(core.Refused) as refused:
        core.admit(header, "nope", sid=None, run_header=None, opening=False, client_name="", protocol_version="",
                   modern=True)
    assert refused.value.status == 404
    with pytest.raises(core.Refused) as refused:
        core.admit(header, "gw", sid=None, run_header=None, opening=False, client_name="", protocol_version="",
                   modern=True, conversation=bad_key)
    assert refused.value.status == 400


def test_the_profiles_tool_marks_ride_the_tokens_statement_and_always_say_what_is_offered_now(
    gw, upstream, lena
) -> None:
    """A call reads the marks of its profile's MCP tools (which pinned specs it may use)
    in the token's statement, not in one of their own; they are this request's: a tool
    disabled since the last call is refused at once, and a profile whose tools changed
    reads its marks on its own (the token's statement read them for the old list)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agents.actions.tokens import token_create
    from agents.gateway import core

    _t, raw = token_create(user=lena)
    header = f"Bearer {raw}"

    def call(record: str, conversation: str | None = None) -> tuple[Any, list[str]]:
        with CaptureQueriesContext(connection) as seen:
            _admitted, started = core.admit_and_start(header, "gw", sid=None, run_header=None, tool=LOOKUP[0],
                                                      args={"record_id": record}, modern=True,
                                                      conversation=conversation)
        return started, [q["sql"] for q in seen.captured_queries]

    first, _sql = call("alpha")  # this process learns the profile's tools
    assert not isinstance(first, core.Reply) and first[0].status == "succeeded"
    second, sql = call("beta")
    assert not isinstance(second, core.Reply) and second[0].status == "succeeded"
    assert "agents_apitoken" in sql[0] and '"agents_mcptool"' in sql[0]
    assert not [s for s in sql[1:] if '"agents_mcptool"' in s], sql

    # Disabled since: the token's statement reads it so, and the call is refused.
    McpTool.objects.filter(name=LOOKUP[0]).update(enabled=False)
    refused, sql = call("gamma")
    assert isinstance(refused, core.Reply) and refused.structured == {
        "airlock": {"status": "unknown_tool", "tool": LOOKUP[0]}}
    assert not [s for s in sql[1:] if '"agents_mcptool"' in s], sql
    McpTool.objects.filter(name=LOOKUP[0]).update(enabled=True)

    # The profile now names its tools one by one: the marks read for the old list are
    # not used; the call reads its own, and a tool the profile no longer names is refused.
    gw.tools = ["web__delete_record", "echo"]
    gw.save(update_fields=["tools"])
    refused, sql = call("delta")
    assert isinstance(refused, core.Reply) and refused.structured == {
        "airlock": {"status": "unknown_tool", "tool": LOOKUP[0]}}
    assert [s for s in sql[1:] if '"agents_mcptool"' in s], sql
    # (A stream of its own: the first stream's run keeps the tools it was launched
    # with, which its drive reads apart from the profile's.)
    gw.tools = ["web__lookup"]
    gw.save(update_fields=["tools"])
    again, sql = call("epsilon", conversation="after")
    assert not isinstance(again, core.Reply) and again[0].status == "succeeded"
    assert [s for s in sql[1:] if '"agents_mcptool"' in s], sql  # learnt the list this time
    again, sql = call("zeta", conversation="after")
    assert not isinstance(again, core.Reply) and again[0].status == "succeeded"
    assert not [s for s in sql[1:] if '"agents_mcptool"' in s], sql
