"""Runs driven through the real store: rows after every step, limits, malformed calls."""

from __future__ import annotations

import json

import pytest

from agents.models import Message, ToolCall, Transition
from tests.conftest import call, final

pytestmark = pytest.mark.django_db(transaction=True)


def states_of(run) -> list[tuple[str, str, str]]:
    return list(run.transitions.order_by("seq").values_list("from_state", "to_state", "kind"))


def test_normal_run_writes_one_transition_per_step(launch, drive) -> None:
    run = drive(launch([call("echo", text="hello"), final("the answer")]))
    assert run.state == "done" and run.answer == "the answer"
    assert states_of(run) == [
        ("", "queued", "launch"),
        ("queued", "planning", "pickup"),
        ("planning", "acting", "model"),
        ("acting", "planning", "tool"),
        ("planning", "done", "model"),
    ]
    assert list(run.transitions.values_list("seq", flat=True)) == [1, 2, 3, 4, 5]
    assert run.steps == 3 and run.version == 5
    tool = ToolCall.objects.get(run=run)
    assert tool.status == "succeeded" and tool.result == {"ok": True, "result": "hello"}
    roles = list(Message.objects.filter(run=run).values_list("role", "content"))
    assert roles == [("user", "test task"), ("assistant", ""), ("tool", "hello"), ("assistant", "the answer")]


def test_state_is_saved_after_each_step(launch, drive) -> None:
    run = launch([call("echo", text="a"), call("echo", text="b"), final()])
    seen = []
    for _ in range(10):
        run = drive(run, max_transitions=1)
        seen.append((run.state, run.version, run.transitions.count()))
        if run.state == "done":
            break
    assert [v for _, v, _ in seen] == list(range(2, 2 + len(seen)))
    assert all(v == n for _, v, n in seen)
    assert seen[-1][0] == "done"


def test_step_budget_fails_at_exactly_the_configured_step(launch, drive) -> None:
    script = [call("echo", text=f"n{i}") for i in range(20)]
    run = drive(launch(script, limits={"max_steps": 5}))
    assert run.state == "failed"
    assert "step budget exhausted" in run.error and "max_steps 5" in run.error
    assert run.steps == 5
    assert ToolCall.objects.filter(run=run, status="succeeded").count() == 2


def test_deadline_fails_the_run(launch, drive) -> None:
    run = launch([call("echo", text="a"), final()], limits={"deadline_seconds": 60})
    run = drive(run, clock_offset=61)
    assert run.state == "failed" and run.error.startswith("deadline passed")
    assert run.steps == 0


def test_consecutive_errors_cap_fails_the_run(launch, drive) -> None:
    script = [call("fail", n=1), call("fail", n=2), call("fail", n=3), final()]
    run = drive(launch(script))
    assert run.state == "failed"
    assert "too many consecutive tool errors (3 of max_consecutive_errors 3)" in run.error
    results = list(ToolCall.objects.filter(run=run).order_by("step").values_list("result", flat=True))
    assert [r["error"] for r in results] == ["RuntimeError"] * 3


def test_a_success_resets_the_error_count(launch, drive) -> None:
    script = [call("fail", n=1), call("fail", n=2), call("echo", text="ok"), call("fail", n=3), call("fail", n=4), final()]
    run = drive(launch(script))
    assert run.state == "done", run.error
    assert run.engine["consecutive_errors"] == 2


def test_cost_budget_from_usage_and_profile_prices(launch, drive, defaults) -> None:
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="scripted").update(price_input_micros=3_000_000, price_output_micros=15_000_000)
    usage = {"input_tokens": 1000, "output_tokens": 100}  # 3000 + 1500 micro-dollars per call
    script = [call("echo", usage=usage, text=f"{i}") for i in range(10)]
    run = drive(launch(script, limits={"max_cost_micros": 10_000}))
    assert run.state == "failed" and "cost budget exhausted" in run.error
    assert run.cost_micros == 13_500  # the third call pushed it over; no fourth call was made
    assert sum(run.transitions.values_list("cost_micros", flat=True)) == 13_500


def test_token_ceiling(launch, drive) -> None:
    usage = {"input_tokens": 400, "output_tokens": 100}
    script = [call("echo", usage=usage, text=f"{i}") for i in range(10)]
    run = drive(launch(script, limits={"max_tokens": 1000}))
    assert run.state == "failed" and "token ceiling reached (1000 of max_tokens 1000)" in run.error
    assert run.tokens == 1000


def test_client_without_usage_marks_cost_unknown(launch, drive) -> None:
    run = drive(launch([final("no usage")]))
    assert run.state == "done" and run.cost_unknown and run.cost_micros == 0
    run2 = drive(launch([final("usage", usage={"input_tokens": 1, "output_tokens": 1})]))
    assert not run2.cost_unknown


def test_repeated_identical_call_fails_before_running_twice(launch, drive) -> None:
    script = [call("ledger_write", entry="x"), call("ledger_write", entry="x"), final()]
    run = drive(launch(script))
    assert run.state == "failed" and run.error.startswith("repeated identical call")
    assert run.ledger.count() == 1
    assert ToolCall.objects.filter(run=run).count() == 1


def test_max_identical_calls_allows_repeats_but_not_a_failing_streak(launch, drive, defaults) -> None:
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="scripted").update(limits={"max_identical_calls": 10, "max_consecutive_errors": 10})
    run = drive(launch([call("echo", text="same")] * 3 + [final()]))
    assert run.state == "done"
    run = drive(launch([call("fail", x=1)] * 5 + [final()]))
    assert run.state == "failed" and "failed 3 times in a row with the same error" in run.error
    assert ToolCall.objects.filter(run=run).count() == 3


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"tool": "no_such_tool", "args": {}}, "unknown_tool"),
        ({"tool": "echo", "args": {"text": 5}}, "invalid_arguments"),
        ({"tool": "echo", "args": ["not", "an", "object"]}, "invalid_arguments"),
        ({"tool": "echo", "args": "{broken json"}, "invalid_arguments"),
    ],
)
def test_malformed_call_becomes_an_error_result_and_the_run_continues(launch, drive, bad, error) -> None:
    run = drive(launch([{"call": bad}, final("recovered")]))
    assert run.state == "done" and run.answer == "recovered"
    tool_msg = Message.objects.get(run=run, role="tool")
    assert json.loads(tool_msg.content)["error"] == error
    assert not ToolCall.objects.filter(run=run).exists()
    t = Transition.objects.filter(run=run, kind="model").order_by("seq").first()
    assert (t.from_state, t.to_state) == ("planning", "planning")


def test_several_calls_in_one_reply_become_one_transition_each_in_order(launch, drive) -> None:
    script = [{"calls": [{"tool": "echo", "args": {"text": "1"}, "id": "a"}, {"tool": "echo", "args": {"text": "2"}, "id": "b"}]}, final()]
    run = drive(launch(script))
    assert run.state == "done"
    tools = list(run.transitions.filter(kind="tool").order_by("seq").values_list("payload", flat=True))
    assert [p["call"]["id"] for p in tools] == ["a", "b"]
    ids = list(Message.objects.filter(run=run, role="tool").order_by("index").values_list("tool_call_id", flat=True))
    assert ids == ["a", "b"]


def test_huge_result_is_capped_in_the_transcript_and_kept_in_the_journal(launch, drive) -> None:
    text = "x" * 20_000 + "\x00tail"
    run = drive(launch([call("echo", text=text), final()]))
    assert run.state == "done"
    msg = Message.objects.get(run=run, role="tool")
    assert msg.content.startswith("x" * 8000) and "result truncated, 12005 more characters" in msg.content
    assert len(msg.content) < 8200
    journal = ToolCall.objects.get(run=run)
    assert journal.result["result"] == "x" * 20_000 + "\ufffdtail"


def test_script_exhausted(launch, drive) -> None:
    run = drive(launch([call("echo", text="a")]))
    assert run.state == "failed" and "script exhausted" in run.error
