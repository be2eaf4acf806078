"""The engine without the database: an in-memory journal, an inline tool runner and a
driver loop that applies each transition's effects the way agents/runs/store.py does.

Plain Python on plain data, like the engine itself: a run of twenty steps takes a
millisecond, so the engine's rules are tested here and the store's tests keep only the
wiring (rows, transactions, sanitising).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from agents.engine.human import apply_decision
from agents.engine.limits import Limits
from agents.engine.protocols import Deps, JournalEntry, ToolOutcome
from agents.engine.registry import Registry, ToolContext, ToolSpec
from agents.engine.run import Move, RunState, new_run
from agents.engine.step import step
from agents.llm.scripted import ScriptedClient
from agents.tools.diagnostic import TOOLS

NOW = 1_800_000_000.0  # a fixed clock: nothing here depends on when the test runs
FINISHED = ("succeeded", "failed")


@dataclass
class MemoryJournal:
    """The tool-call journal as a dict keyed by idempotency key (the store's table)."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, key: str) -> JournalEntry | None:
        row = self.rows.get(key)
        return JournalEntry(row["status"], row.get("result")) if row else None

    def executed(self, fingerprint: str) -> int:
        return sum(1 for row in self.rows.values() if row["fp"] == fingerprint and row["status"] in FINISHED)

    def begin(self, key: str) -> bool:
        row = self.rows.get(key)
        if row is None or row["status"] != "intended":
            return False  # someone else started it
        row["status"] = "started"
        row["attempts"] += 1
        return True

    def apply(self, t: Move) -> None:
        """The journal effects the store writes in the transition's transaction."""
        if t.intent:
            self.rows.setdefault(t.intent["key"], {**t.intent, "status": "intended", "attempts": 0})
        if t.journal_reset:
            self.rows[t.journal_reset]["status"] = "intended"
        if t.journal_result:
            row = self.rows.setdefault(t.journal_result["key"], {"fp": t.journal_result["fp"], "attempts": 0})
            row.update(status=t.journal_result["status"], result=t.journal_result["result"])


class BlankJournal:
    """A journal that has seen no call, so every call may start: for tests that call
    step() themselves without applying each transition's journal effects."""

    def __init__(self) -> None:
        self.rows: dict[str, JournalEntry] = {}

    def get(self, key: str) -> JournalEntry | None:
        return self.rows.get(key)

    def executed(self, fingerprint: str) -> int:
        return 0

    def begin(self, key: str) -> bool:
        self.rows[key] = JournalEntry("started")
        return True


class InlineRunner:
    """Runs a tool in the calling thread; an exception is an error result."""

    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        try:
            value = spec.func(args, ctx)
        except Exception as exc:  # noqa: BLE001 - every failure is a result
            return ToolOutcome(ok=False, error=type(exc).__name__, detail=str(exc)[:2000])
        return ToolOutcome(ok=True, value=value)


@dataclass
class Run:
    """A run driven in memory: its state, every transition and every side effect."""

    state: RunState
    deps: Deps
    transitions: list[Move] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[tuple[str | None, Any]] = field(default_factory=list)

    @property
    def journal(self) -> MemoryJournal:
        return self.deps.journal  # type: ignore[return-value]

    def edges(self) -> list[tuple[str, str, str]]:
        return [(t.from_state, t.to_state, t.kind) for t in self.transitions]

    def tool_messages(self) -> list[dict[str, Any]]:
        return [m for m in self.state.messages if m["role"] == "tool"]

    def commit(self, t: Move, after: RunState) -> None:
        self.journal.apply(t)
        if t.approval:
            self.approvals.append(dict(t.approval))
        if t.approval_close:
            for row in self.approvals:
                if row["status"] == "pending":
                    row["status"] = t.approval_close
        self.transitions.append(t)
        self.state = after

    def decide(self, decision: str, note: str = "", by: str = "rita") -> Run:
        """A reviewer's answer, committed as approval_decide commits it."""
        after, t = self.untouched(lambda: apply_decision(self.state, decision, note, by=by))
        self.commit(t, after)
        return self

    def drive(self, max_transitions: int = 500) -> Run:
        """step() until the run rests, committing each transition; as driver.drive does."""
        for _ in range(max_transitions):
            out = self.untouched(lambda: step(self.state, self.deps))
            if out is None:
                break
            self.commit(out[1], out[0])
        return self

    def untouched(self, move: Any) -> Any:
        """`move()`, checking it left the state it was given as it was: RunState.copy()
        is shallow, so a step must replace nested values, never change them in place."""
        before = json.dumps(vars(self.state), sort_keys=True, default=str)
        out = move()
        assert json.dumps(vars(self.state), sort_keys=True, default=str) == before, "a step changed its input state"
        return out


def registry(run: Run | None = None) -> Registry:
    """The diagnostic tools, with the ledger kept in memory instead of LedgerEntry rows."""
    ledger: list[tuple[str | None, Any]] = run.ledger if run is not None else []

    def ledger_write(args: dict[str, Any], ctx: ToolContext) -> str:
        if all(key != ctx.idempotency_key for key, _ in ledger):  # one entry per key
            ledger.append((ctx.idempotency_key, args["entry"]))
        return "recorded"

    def ledger_write_unsafe(args: dict[str, Any], ctx: ToolContext) -> str:
        ledger.append((None, args["entry"]))
        return "recorded"

    memory = {"ledger_write": ledger_write, "ledger_write_unsafe": ledger_write_unsafe}
    return Registry(dataclasses.replace(s, func=memory[s.name]) if s.name in memory else s for s in TOOLS)


def launch(
    script: list[Any],
    *,
    limits: dict[str, int] | None = None,
    profile_limits: dict[str, int] | None = None,
    clock: float = NOW,
    **kwargs: Any,
) -> Run:
    """A queued run of the scripted model with the diagnostic tools: what run_launch
    builds from the `scripted` profile, without the rows."""
    state = new_run(
        "1",
        limits=Limits.from_dict(profile_limits).tightened(limits),
        now=NOW,
        task=kwargs.pop("task", "test task"),
        **kwargs,
    )
    run = Run(state, Deps(model=ScriptedClient(script), registry=Registry(), journal=MemoryJournal()))
    run.deps.registry = registry(run)
    run.deps.runner = InlineRunner()
    run.deps.now = lambda: clock
    return run


def drive(script: list[Any], **kwargs: Any) -> Run:
    return launch(script, **kwargs).drive()
