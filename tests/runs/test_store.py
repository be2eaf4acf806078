"""Runs driven through the real store: the wiring of the engine to rows.

The engine's rules (limits, repeats, the output cap, several calls per reply, decisions)
are tested pure in tests/engine/test_step.py; these few check what only the store does:
rows after every step, the profile's prices and limits reaching the run, the journal
counted from the database, text sanitised for PostgreSQL."""

from __future__ import annotations

import json

import pytest

from agents.models import Message, ToolCall, Transition
from tests.helpers import call, final, requires_postgres

pytestmark = pytest.mark.django_db


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


def test_cost_budget_from_usage_and_profile_prices(launch, drive, defaults) -> None:
    from agents.models import AgentProfile

    AgentProfile.objects.filter(name="scripted").update(price_input_micros=3_000_000, price_output_micros=15_000_000)
    usage = {"input_tokens": 1000, "output_tokens": 100}  # 3000 + 1500 micro-dollars per call
    script = [call("echo", usage=usage, text=f"{i}") for i in range(10)]
    run = drive(launch(script, limits={"max_cost_micros": 10_000}))
    assert run.state == "failed" and "cost budget exhausted" in run.error
    assert run.cost_micros == 13_500  # the third call pushed it over; no fourth call was made
    assert sum(run.transitions.values_list("cost_micros", flat=True)) == 13_500


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
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


def test_malformed_call_becomes_an_error_result_and_the_run_continues(launch, drive) -> None:
    bad, error = {"tool": "echo", "args": {"text": 5}}, "invalid_arguments"
    run = drive(launch([{"call": bad}, final("recovered")]))
    assert run.state == "done" and run.answer == "recovered"
    tool_msg = Message.objects.get(run=run, role="tool")
    assert json.loads(tool_msg.content)["error"] == error
    assert not ToolCall.objects.filter(run=run).exists()
    t = Transition.objects.filter(run=run, kind="model").order_by("seq").first()
    assert (t.from_state, t.to_state) == ("planning", "planning")


def test_huge_result_is_capped_in_the_transcript_and_kept_in_the_journal(launch, drive) -> None:
    text = "x" * 20_000 + "\x00tail"
    run = drive(launch([call("echo", text=text), final()]))
    assert run.state == "done"
    msg = Message.objects.get(run=run, role="tool")
    assert msg.content.startswith("x" * 8000) and "result truncated, 12005 more characters" in msg.content
    assert len(msg.content) < 8200
    journal = ToolCall.objects.get(run=run)
    assert journal.result["result"] == "x" * 20_000 + "\ufffdtail"




def test_engine_json_is_cleaned_only_when_it_needs_to_be() -> None:
    from agents.lib import sanitize

    dirty = {"a": ["ok", {"b": "x\x00y"}], "c": "\ud800", "n": 1}
    cleaned, text = sanitize.clean_json(dirty)
    assert cleaned == {"a": ["ok", {"b": "x\ufffdy"}], "c": "?", "n": 1}
    assert json.loads(text) == cleaned
    plain = {"a": [1, "é", None], "b": {"c": True}}
    value, text = sanitize.clean_json(plain)
    assert value is plain and json.loads(text) == plain


@requires_postgres()  # the one-statement commit is PostgreSQL's
def test_a_transition_keeps_the_stored_policy_instead_of_sending_it_again(launch, drive, monkeypatch) -> None:
    """The policy is fixed at launch: each later transition's statement carries the
    state without it, and the row keeps the stored one, so the state read back (and
    replayed from the transitions) is the whole state, policy included."""
    from agents.models import AgentProfile, Run
    from agents.runs import statement
    from agents.runs.verify import verify_run

    rules = [{"tool": "echo", "then": "allow", "reason": f"rule {n}, kept from launch"} for n in range(5)]
    AgentProfile.objects.filter(name="scripted").update(rules=rules)
    sent: list[tuple[dict[str, object], bool]] = []
    commit = statement.commit_statement

    def recording(*args: object, **kwargs: object) -> int | None:
        sent.append((json.loads(str(args[2])), bool(kwargs.get("keep_policy"))))
        return commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(statement, "commit_statement", recording)
    run = drive(launch([call("echo", text="a"), final("done")]))
    assert run.state == "done" and len(sent) == 4
    assert all("policy" not in engine and kept for engine, kept in sent)
    stored = Run.objects.get(pk=run.pk).engine["policy"]
    assert [r["reason"] for r in stored["rules"]] == [r["reason"] for r in rules]
    assert verify_run(run) == []
