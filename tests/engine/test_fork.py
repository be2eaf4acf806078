"""A fork's calls that its parent already made, in the pure engine (planning._already_ran):
the parent's journal row sits in the in-memory journal, the fork's state lists it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from agents.engine.fingerprints import fingerprint
from agents.engine.human import apply_decision
from agents.engine.protocols import JournalEntry
from tests.engine.harness import MemoryJournal, Run, launch
from tests.helpers import call, final

PARENT_KEY = "k" * 64


@dataclass
class ForkJournal(MemoryJournal):
    """The fork's own journal; a key it does not hold is looked up in the parent's, as
    the store's journal reads any key (idempotency keys are unique across runs)."""

    parent: dict[str, JournalEntry] = field(default_factory=dict)

    def get(self, key: str) -> JournalEntry | None:
        return super().get(key) or self.parent.get(key)


def forked(script: list[Any], tool: str, status: str = "succeeded", reuse: str = "recorded") -> Run:
    """A fork whose parent ran `tool` with {"entry": "paid"} after the fork point."""
    run = launch(script)
    result = {"ok": True, "result": "recorded in the parent"} if status == "succeeded" else None
    run.deps.journal = ForkJournal(parent={PARENT_KEY: JournalEntry(status, result)})
    prior = {"fp": fingerprint(tool, {"entry": "paid"}), "key": PARENT_KEY, "tool": tool, "status": status,
             "step": 1, "seq": 4, "run": 7}
    run.state.fork = {"run": 7, "seq": 2, "reuse": reuse, "prior": [prior]}
    return run


def test_a_safe_call_reuses_the_parents_result_and_runs_nothing() -> None:
    run = forked([call("ledger_write", entry="paid"), final("done")], "ledger_write").drive()
    assert run.state.state == "done" and run.ledger == []
    assert run.tool_messages()[0]["content"] == "recorded in the parent"
    tool = next(t for t in run.transitions if t.kind == "tool")
    assert tool.detail["reused"] == {"run": 7, "seq": 4}
    assert tool.journal_result is not None and tool.journal_result["status"] == "succeeded"
    assert run.state.fork["prior"] == []  # met once


def test_other_arguments_are_another_call() -> None:
    run = forked([call("ledger_write", entry="refund"), final("done")], "ledger_write").drive()
    assert run.ledger == [(run.ledger[0][0], "refund")]
    assert len(run.state.fork["prior"]) == 1


@pytest.mark.parametrize(("status", "reuse"), [("succeeded", "none"), ("started", "recorded")])
def test_a_safe_call_runs_again_when_asked_or_with_no_result(status: str, reuse: str) -> None:
    run = forked([call("ledger_write", entry="paid"), final("done")], "ledger_write", status, reuse).drive()
    assert run.state.state == "done" and len(run.ledger) == 1
    assert next(t for t in run.transitions if t.kind == "model").detail["prior"]["status"] == status


def test_an_unsafe_call_asks_and_reuse_runs_nothing() -> None:
    run = forked([call("ledger_write_unsafe", entry="paid"), final("done")], "ledger_write_unsafe").drive()
    assert run.state.state == "awaiting_approval"
    [approval] = run.approvals
    assert approval["kind"] == "already_ran" and approval["reason"] == "this exact call already ran in run #7 at step 4"
    assert approval["prior"]["key"] == PARENT_KEY
    run.decide("reuse").drive()
    assert run.state.state == "done" and run.ledger == []
    assert run.tool_messages()[0]["content"] == "recorded in the parent"


def test_an_unsafe_call_whose_outcome_is_unknown_cannot_be_reused() -> None:
    run = forked([call("ledger_write_unsafe", entry="paid"), final("done")], "ledger_write_unsafe", "started").drive()
    assert run.approvals[0]["reason"].endswith("outcome unknown: it may or may not have taken effect")
    with pytest.raises(ValueError, match="no recorded result to reuse"):
        apply_decision(run.state, "reuse")
    run.decide("approve").drive()
    assert run.state.state == "done" and len(run.ledger) == 1


def test_reuse_is_no_answer_to_a_policy_question() -> None:
    run = launch([call("ledger_write_unsafe", entry="x"), final("done")], always_ask_tools=["ledger_write_unsafe"])
    run.drive()
    assert run.approvals[0]["kind"] == "policy"
    with pytest.raises(ValueError, match="takes approve or reject"):
        apply_decision(run.state, "reuse")
