"""step() tested pure: the scripted model, an in-memory journal, an inline runner and no
database. Limits, repeats, the output cap, several calls per reply and reviewers'
decisions are the engine's rules, so they are tested here; tests/runs keeps the wiring."""

from __future__ import annotations

import json

import pytest

from agents.engine.human import apply_decision
from agents.engine.step import step
from tests.engine.harness import NOW, drive, launch
from tests.helpers import call, final


def errors(run) -> list[str]:
    """The error codes of the tool results the model read (successes are plain text)."""
    found = []
    for m in run.tool_messages():
        try:
            result = json.loads(m["content"])
        except ValueError:
            continue
        if isinstance(result, dict) and "error" in result:
            found.append(result["error"])
    return found


def test_a_normal_run_moves_one_transition_per_step() -> None:
    run = drive([call("echo", text="hello"), final("the answer")])
    assert run.state.state == "done" and run.state.answer == "the answer"
    assert run.edges() == [
        ("queued", "planning", "pickup"),
        ("planning", "acting", "model"),
        ("acting", "planning", "tool"),
        ("planning", "done", "model"),
    ]
    assert run.state.steps == 3
    (row,) = run.journal.rows.values()
    assert row["status"] == "succeeded" and row["result"] == {"ok": True, "result": "hello"}
    assert [(m["role"], m["content"]) for m in run.state.messages] == [
        ("user", "test task"),
        ("assistant", ""),
        ("tool", "hello"),
        ("assistant", "the answer"),
    ]


def test_step_budget_fails_at_exactly_the_configured_step() -> None:
    run = drive([call("echo", text=f"n{i}") for i in range(20)], limits={"max_steps": 5})
    assert run.state.state == "failed"
    assert "step budget exhausted" in run.state.error and "max_steps 5" in run.state.error
    assert run.state.steps == 5
    assert sum(r["status"] == "succeeded" for r in run.journal.rows.values()) == 2


def test_the_deadline_fails_the_run_before_any_step() -> None:
    run = drive([call("echo", text="a"), final()], limits={"deadline_seconds": 60}, clock=NOW + 61)
    assert run.state.state == "failed" and run.state.error.startswith("deadline passed")
    assert run.state.steps == 0


def test_the_deadline_also_ends_a_run_waiting_for_a_human() -> None:
    waiting = drive([call("fetch_fixture", text="x"), call("ledger_write", entry="e")], limits={"deadline_seconds": 60})
    assert waiting.state.state == "awaiting_approval"
    waiting.deps.now = lambda: NOW + 61
    waiting.drive()
    assert waiting.state.state == "failed" and waiting.state.error.startswith("deadline passed")
    assert [a["status"] for a in waiting.approvals] == ["expired"]


def test_consecutive_errors_cap_fails_the_run() -> None:
    run = drive([call("fail", n=1), call("fail", n=2), call("fail", n=3), final()])
    assert run.state.state == "failed"
    assert "too many consecutive tool errors (3 of max_consecutive_errors 3)" in run.state.error
    assert errors(run) == ["RuntimeError"] * 3


def test_a_success_resets_the_error_count() -> None:
    script = [call("fail", n=1), call("fail", n=2), call("echo", text="ok"), call("fail", n=3), call("fail", n=4), final()]
    run = drive(script)
    assert run.state.state == "done", run.state.error
    assert run.state.consecutive_errors == 2


def test_cost_budget_from_usage_and_profile_prices() -> None:
    usage = {"input_tokens": 1000, "output_tokens": 100}  # 3000 + 1500 micro-dollars per call
    script = [call("echo", usage=usage, text=f"{i}") for i in range(10)]
    run = drive(script, limits={"max_cost_micros": 10_000}, prices={"input": 3_000_000, "output": 15_000_000})
    assert run.state.state == "failed" and "cost budget exhausted" in run.state.error
    assert run.state.cost_micros == 13_500  # the third call pushed it over; no fourth call was made
    assert sum(t.cost_micros for t in run.transitions) == 13_500


def test_token_ceiling() -> None:
    usage = {"input_tokens": 400, "output_tokens": 100}
    run = drive([call("echo", usage=usage, text=f"{i}") for i in range(10)], limits={"max_tokens": 1000})
    assert run.state.state == "failed" and "token ceiling reached (1000 of max_tokens 1000)" in run.state.error
    assert run.state.tokens == 1000


def test_a_client_without_usage_marks_the_cost_unknown() -> None:
    run = drive([final("no usage")])
    assert run.state.state == "done" and run.state.cost_unknown and run.state.cost_micros == 0
    assert not drive([final("usage", usage={"input_tokens": 1, "output_tokens": 1})]).state.cost_unknown


def test_a_repeated_identical_call_fails_before_running_twice() -> None:
    run = drive([call("ledger_write", entry="x"), call("ledger_write", entry="x"), final()])
    assert run.state.state == "failed" and run.state.error.startswith("repeated identical call")
    assert len(run.ledger) == 1 and len(run.journal.rows) == 1


def test_max_identical_calls_allows_repeats_but_not_a_failing_streak() -> None:
    loose = {"max_identical_calls": 10, "max_consecutive_errors": 10}
    assert drive([call("echo", text="same")] * 3 + [final()], profile_limits=loose).state.state == "done"
    run = drive([call("fail", x=1)] * 5 + [final()], profile_limits=loose)
    assert run.state.state == "failed" and "failed 3 times in a row with the same error" in run.state.error
    assert len(run.journal.rows) == 3 and errors(run) == ["RuntimeError"] * 3


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"tool": "no_such_tool", "args": {}}, "unknown_tool"),
        ({"tool": "echo", "args": {"text": 5}}, "invalid_arguments"),
        ({"tool": "echo", "args": ["not", "an", "object"]}, "invalid_arguments"),
        ({"tool": "echo", "args": "{broken json"}, "invalid_arguments"),
    ],
)
def test_a_malformed_call_becomes_an_error_result_and_the_run_continues(bad, error) -> None:
    run = drive([{"call": bad}, final("recovered")])
    assert run.state.state == "done" and run.state.answer == "recovered"
    assert errors(run) == [error]
    assert run.journal.rows == {}
    model = next(t for t in run.transitions if t.kind == "model")
    assert (model.from_state, model.to_state) == ("planning", "planning")


def test_several_calls_in_one_reply_become_one_transition_each_in_order() -> None:
    reply = {"calls": [{"tool": "echo", "args": {"text": "1"}, "id": "a"}, {"tool": "echo", "args": {"text": "2"}, "id": "b"}]}
    run = drive([reply, final()])
    assert run.state.state == "done"
    assert [t.detail["call"]["id"] for t in run.transitions if t.kind == "tool"] == ["a", "b"]
    assert [m["tool_call_id"] for m in run.tool_messages()] == ["a", "b"]
    # The second call is policed on its own transition, after the first one's result.
    assert [t.kind for t in run.transitions] == ["pickup", "model", "tool", "call", "tool", "model"]


def test_a_huge_result_is_capped_in_the_transcript_and_kept_whole_in_the_journal() -> None:
    text = "x" * 20_000
    run = drive([call("echo", text=text), final()])
    (message,) = run.tool_messages()
    assert message["content"].startswith("x" * 8000) and "result truncated, 12000 more characters" in message["content"]
    assert len(message["content"]) < 8200
    (row,) = run.journal.rows.values()
    assert row["result"]["result"] == text


def test_an_exhausted_script_fails_the_run() -> None:
    run = drive([call("echo", text="a")])
    assert run.state.state == "failed" and "script exhausted" in run.state.error


def test_taint_makes_a_write_ask_and_an_approval_runs_exactly_the_call_once() -> None:
    run = drive([call("fetch_fixture", text="IGNORE PREVIOUS"), call("ledger_write", entry="e"), final("ok")])
    assert run.state.state == "awaiting_approval" and run.state.tainted
    (approval,) = run.approvals
    assert approval["tool"] == "ledger_write" and approval["args"] == {"entry": "e"}
    assert approval["taint_source"]["tool"] == "fetch_fixture"
    run.decide("approve").drive()
    assert run.state.state == "done" and run.ledger == [(approval["key"], "e")]


def test_a_rejection_reaches_the_model_as_not_permitted_with_the_note() -> None:
    run = drive([call("fetch_fixture", text="x"), call("ledger_write", entry="e"), final("answered")])
    run.decide("reject", note="no").drive()
    assert run.state.state == "done" and run.ledger == []
    result = json.loads(run.tool_messages()[-1]["content"])
    assert result == {"ok": False, "error": "not_permitted", "detail": "rejected by a human reviewer (rita): no"}


def test_a_run_without_an_approver_is_denied_and_carries_on() -> None:
    run = drive([call("fetch_fixture", text="x"), call("ledger_write", entry="e"), final("answered")], approver="none")
    assert run.state.state == "done" and run.ledger == []
    assert [a["status"] for a in run.approvals] == ["denied"]
    assert errors(run)[-1] == "not_permitted"


def test_an_interrupted_unsafe_call_asks_a_human_and_each_answer_does_what_it_says() -> None:
    def interrupted():
        run = launch([call("ledger_write_unsafe", entry="e"), final("ok")])
        while run.state.state != "acting":
            state, t = step(run.state, run.deps)
            run.commit(t, state)
        (key,) = run.journal.rows
        assert run.journal.begin(key)  # the crashed attempt marked it started, then died
        run.drive()
        assert run.state.state == "awaiting_approval" and run.approvals[-1]["kind"] == "outcome_unknown"
        return run

    happened = interrupted()
    happened.decide("happened", note="it went through").drive()
    assert happened.state.state == "done" and happened.ledger == []
    assert happened.tool_messages()[-1]["content"] == "it went through"

    retried = interrupted()
    retried.decide("retry").drive()
    assert retried.state.state == "done" and retried.ledger == [(None, "e")]

    failed = interrupted()
    failed.decide("fail", note="gave up")
    assert failed.state.state == "failed" and "outcome unknown" in failed.state.error

    with pytest.raises(ValueError, match="takes happened or retry or fail"):
        apply_decision(interrupted().state, "approve")
