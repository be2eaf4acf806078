"""Huge results, NUL bytes and invalid UTF-8: capped, sanitised, nothing crashes."""

from __future__ import annotations

import pytest

from agents import store
from agents.engine.registry import ToolSpec
from agents.models import AgentProfile, Message, Run, ToolCall
from tests.conftest import call, final

pytestmark = pytest.mark.django_db(transaction=True)

TEN_MB = 10 * 1024 * 1024


def hostile(args, ctx):
    kind = args["kind"]
    if kind == "huge":
        return "A" * TEN_MB
    if kind == "nul":
        return "before\x00after"
    if kind == "bad_utf8":
        return b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")
    return {"nested": ["\x00", b"\xff".decode("utf-8", "surrogateescape")]}


SPEC = ToolSpec(
    "hostile", "returns hostile output",
    {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]},
    "read", "internal", "safe", hostile,
)


def run_with_hostile_tool(launch, kind: str) -> Run:
    AgentProfile.objects.filter(name="scripted").update(tools=None)
    run = launch([call("hostile", kind=kind), final("survived")])
    deps = store.deps_for(Run.objects.select_related("profile").get(pk=run.pk))
    deps.registry.add(SPEC)
    return store.drive(run.pk, deps=deps)


def test_a_10_mb_result_is_capped_in_the_transcript_and_bounded_in_the_journal(launch, defaults, settings) -> None:
    run = run_with_hostile_tool(launch, "huge")
    assert run.state == "done" and run.answer == "survived"
    content = Message.objects.get(run=run, role="tool").content
    assert content.startswith("A" * 8000) and content[8000:].startswith("\n[airlock: result truncated")
    assert len(content) < 8200
    entry = ToolCall.objects.get(run=run)
    assert entry.result_truncated and entry.result_chars > TEN_MB
    assert len(entry.result["result_json_prefix"]) == settings.AIRLOCK_JOURNAL_MAX_CHARS


@pytest.mark.parametrize(
    "kind, shown",
    [
        ("nul", "before\ufffdafter"),
        ("bad_utf8", "caf? ??"),
        ("nested", '{"nested": ["\\u0000", "?"]}'),
    ],
)
def test_nul_bytes_and_invalid_utf8_are_stored_sanitised(launch, defaults, kind, shown) -> None:
    run = run_with_hostile_tool(launch, kind)
    assert run.state == "done"
    assert Message.objects.get(run=run, role="tool").content == shown
    assert ToolCall.objects.get(run=run).status == "succeeded"
