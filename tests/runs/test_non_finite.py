"""A tool that returns NaN or infinity (issue 34, item 7, from the other side): json.dumps
writes them and PostgreSQL's jsonb refuses them, so the commit failed and the run could
not move. They are stored as text, like NUL bytes, and the run goes on."""

from __future__ import annotations

import pytest

from agents.engine.registry import ToolSpec
from agents.models import AgentProfile, Message, Run, ToolCall
from agents.runs import driver
from tests.helpers import call, final

pytestmark = pytest.mark.django_db


def _numbers(args, ctx):
    return {"mean": float("nan"), "max": float("inf"), "rows": [float("-inf"), 1.5]}


NUMBERS = ToolSpec("numbers", "Returns non-finite numbers.", {"type": "object"}, "read", "internal", "safe", _numbers)


def test_non_finite_numbers_in_a_tool_result_are_stored_as_text(launch, defaults) -> None:
    AgentProfile.objects.filter(name="scripted").update(tools=None)
    run = launch([call("numbers"), final("survived")])
    deps = driver.deps_for(Run.objects.select_related("profile").get(pk=run.pk))
    deps.registry.add(NUMBERS)
    run = driver.drive(run.pk, deps=deps)
    assert run.state == "done" and run.answer == "survived"
    entry = ToolCall.objects.get(run=run)
    assert entry.status == "succeeded"
    assert entry.result == {"ok": True, "result": {"mean": "nan", "max": "inf", "rows": ["-inf", 1.5]}}
    # What the model read is text (a tool result's JSON), where NaN is only a word.
    assert Message.objects.get(run=run, role="tool").content == '{"mean": NaN, "max": Infinity, "rows": [-Infinity, 1.5]}'
