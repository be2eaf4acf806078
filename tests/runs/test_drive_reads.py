"""The drive's reads written as SQL (agents/lib/rows.py) give what the ORM gives: the same
field values, the related row attached, the same rows in the same order."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import access
from agents.models import McpServer, McpTool, Message, Run
from agents.runs import store
from agents.tools import mcp
from tests.helpers import call, final

pytestmark = pytest.mark.django_db


def fields(obj: object) -> dict[str, object]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}  # type: ignore[attr-defined]


def test_read_run_is_the_orm_read_with_its_profile(launch, drive) -> None:
    # A run with every kind of column filled: JSON, datetimes, a lease, an answer.
    run = drive(launch([call("echo", text="hi"), final("bye")]))
    Run.objects.filter(pk=run.pk).update(lease_owner="w", lease_expires=run.deadline, error="x\ny")
    orm = Run.objects.select_related("profile").get(pk=run.pk)

    read = store.read_run(run.pk)

    assert read is not None and fields(read) == fields(orm)
    with CaptureQueriesContext(connection) as queries:
        profile = read.profile
    assert len(queries) == 0  # attached, as select_related attaches it
    assert fields(profile) == fields(orm.profile)
    assert read.engine == orm.engine and isinstance(read.engine, dict)
    assert read._state.adding is False  # saved: save() updates, never inserts


def test_read_run_of_no_run_is_none(defaults) -> None:
    assert store.read_run(987654321) is None


def test_the_transcript_is_the_messages_in_order(launch, drive) -> None:
    run = drive(launch([call("echo", text="one"), call("echo", text="two"), final("done")]))
    expected = []
    for m in Message.objects.filter(run=run).order_by("index"):
        message = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = m.tool_calls
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        expected.append(message)

    transcript = Message.engine_transcript(run)

    assert transcript == expected
    assert [m["role"] for m in transcript].count("tool") == 2
    assert store.load(run).messages == transcript


def test_offered_tools_are_the_tools_whose_offered_is_true(defaults) -> None:
    servers = {
        enabled: McpServer.objects.create(
            name=f"s{int(enabled)}", transport="http", url="http://127.0.0.1:9/mcp", enabled=enabled
        )
        for enabled in (True, False)
    }
    combos = itertools.product((True, False), ("active", "changed", "removed", "invalid"), (True, False))
    for i, (server_on, status, tool_on) in enumerate(combos):
        server = servers[server_on]
        McpTool.objects.create(
            server=server,
            mcp_name=f"t{i}",
            name=f"{server.name}__t{i}",
            input_schema={"type": "object"},
            annotations={"readOnlyHint": i % 2 == 0},
            sha256="0" * 64,
            status=status,
            enabled=tool_on,
        )

    offered = mcp.offered_tools()

    expected = [t for t in McpTool.objects.select_related("server").order_by("id") if t.offered()]
    assert [fields(t) for t in offered] == [fields(t) for t in expected]
    assert len(offered) == 1
    with CaptureQueriesContext(connection) as queries:
        assert offered[0].server.name == "s1" and offered[0].timeout() == 30.0
    assert len(queries) == 0
    assert [s.name for s in mcp.specs()] == ["s1__t0"]


@pytest.mark.parametrize("launched_by_someone", [True, False])
def test_the_readable_run_is_the_orm_read_with_profile_and_launcher(
    launch, drive, lena, otto, launched_by_someone
) -> None:
    run = drive(launch([call("echo", text="hi"), final("bye")]))
    Run.objects.filter(pk=run.pk).update(created_by=lena if launched_by_someone else None)
    orm = Run.objects.select_related("profile", "created_by").defer("script").get(pk=run.pk)

    read = access.readable_run(otto, run.pk)  # an operator reads every run

    assert read.get_deferred_fields() == orm.get_deferred_fields() == {"script"}
    assert {k: v for k, v in fields(read).items() if k != "script"} == {
        k: v for k, v in fields(orm).items() if k != "script"
    }
    with CaptureQueriesContext(connection) as queries:
        profile, launcher = read.profile, read.created_by
    assert len(queries) == 0
    assert fields(profile) == fields(orm.profile)
    assert (launcher is None) is (not launched_by_someone)
    if launched_by_someone:
        assert fields(launcher) == fields(orm.created_by)
    assert read.script == orm.script  # deferred, and read on demand as defer() does
