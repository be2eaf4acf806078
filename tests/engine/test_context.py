"""Context management in the pure engine: step() with a scripted model, an in-memory
journal and an inline runner, no database."""

from __future__ import annotations

import json
import math
from typing import Any

from agents.engine import context, patch
from agents.engine.limits import Limits
from agents.engine.protocols import Deps, JournalEntry, ModelReply, ModelRequest, ProposedCall, ToolOutcome, Usage
from agents.engine.registry import Registry, ToolContext, ToolSpec
from agents.engine.run import RunState, new_run
from agents.engine.step import step

BUDGET = 16_000
TURNS = 60
PAGE = {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"], "additionalProperties": False}


def read_page(args: dict[str, Any], ctx: ToolContext) -> str:
    n = args["page"]
    return f"Page {n}. " + " ".join(f"word{n}-{i}" for i in range(650))  # about 6,500 characters, under the transcript cap


TOOLS = Registry([ToolSpec("read_page", "Returns one page of the manual.", PAGE, "read", "internal", "safe", read_page)])


class MemoryJournal:
    def __init__(self) -> None:
        self.entries: dict[str, JournalEntry] = {}
        self.fingerprints: dict[str, int] = {}

    def get(self, key: str) -> JournalEntry | None:
        return self.entries.get(key)

    def executed(self, fingerprint: str) -> int:
        return self.fingerprints.get(fingerprint, 0)

    def begin(self, key: str) -> bool:
        return True

    def record(self, effect: dict[str, Any]) -> None:
        self.entries[effect["key"]] = JournalEntry(effect["status"], effect["result"])
        self.fingerprints[effect["fp"]] = self.fingerprints.get(effect["fp"], 0) + 1


class InlineRunner:
    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        return ToolOutcome(ok=True, value=spec.func(args, ctx))


def true_tokens(request: ModelRequest) -> int:
    """The provider's own count: denser than the engine's 4 characters a token, so the
    engine must learn the ratio from the reported usage to stay within its budget."""
    text = json.dumps(request.messages) + json.dumps([t.openapi() for t in request.tools])
    return math.ceil(len(text) / 3.3)


class ReadingModel:
    """Reads one new page per turn, then answers; reports usage like a provider."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def propose(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        usage = Usage(true_tokens(request), 20)
        if request.turn == TURNS - 1:
            return ModelReply(final="I read the whole manual.", usage=usage)
        return ModelReply(calls=(ProposedCall(f"call_{request.turn}", "read_page", {"page": request.turn}),), usage=usage)


def drive(state: RunState, deps: Deps) -> tuple[RunState, list[Any]]:
    """Step to rest, replaying every transition's patch as the store would."""
    journal = deps.journal
    replayed = json.loads(json.dumps(state.engine_json()))
    kinds = []
    while (outcome := step(state, deps)) is not None:
        new, t = outcome
        replayed = patch.apply(replayed, patch.diff(state.engine_json(), new.engine_json()))
        if t.journal_result:
            journal.record(t.journal_result)  # type: ignore[attr-defined]
        kinds.append(t)
        state = new
    assert replayed == state.engine_json()
    return state, kinds


def test_sixty_turns_with_large_results_stay_within_the_budget_and_never_split_a_pair() -> None:
    limits = Limits(max_steps=500, max_tokens=100_000_000, max_cost_micros=10**12)
    state = new_run("1", limits=limits, now=0.0, system_prompt="You read manuals.", task="Read the manual.",
                    context_tokens=BUDGET)
    model = ReadingModel()
    deps = Deps(model=model, registry=TOOLS, journal=MemoryJournal(), runner=InlineRunner(), now=lambda: 1.0)
    final, transitions = drive(state, deps)

    assert final.state == "done", final.error
    assert len(model.requests) == TURNS
    compactions = [t for t in transitions if t.kind == "compact"]
    assert len(compactions) >= 5
    # Each compaction folds results not folded before, and never a call still open.
    folded = [i for t in compactions for i in t.detail["folded"]]
    assert len(folded) == len(set(folded))
    for request in model.requests:
        assert true_tokens(request) <= BUDGET
        messages = request.messages
        assert messages[:2] == [{"role": "system", "content": "You read manuals."},
                                {"role": "user", "content": "Read the manual."}]
        # Every call is followed by its own result, before the next assistant turn.
        for i, m in enumerate(messages):
            if m["role"] == "assistant" and m.get("tool_calls"):
                results = [r["tool_call_id"] for r in messages[i + 1:i + 1 + len(m["tool_calls"])]]
                assert results == [c["id"] for c in m["tool_calls"]]
        # The last turns are whole.
        last = [m for m in messages[-2 * context.KEEP_TURNS + 1:] if m["role"] == "tool"]
        assert all(not m["content"].startswith("[airlock: this earlier result") for m in last)
    # Compaction did its job: without it the last prompt would be far over budget.
    assert context.raw_tokens(final.messages, TOOLS.subset(None)) > 5 * BUDGET
    # The stored transcript is complete: every page, whole.
    pages = [m["content"] for m in final.messages if m["role"] == "tool"]
    assert pages == [read_page({"page": n}, None) for n in range(TURNS - 1)]  # type: ignore[arg-type]


def test_the_scale_learns_from_reported_usage() -> None:
    messages = [{"role": "user", "content": "x" * 4000}]
    raw = context.raw_tokens(messages)
    scale = context.corrected_scale(1500, raw)
    assert context.scaled(raw, scale) >= 1500 > raw


def test_a_budget_too_small_for_the_last_turns_fails_the_run_with_the_reason() -> None:
    limits = Limits(max_steps=500, max_tokens=100_000_000)
    state = new_run("1", limits=limits, now=0.0, task="Read the manual.", context_tokens=2_000)
    deps = Deps(model=ReadingModel(), registry=TOOLS, journal=MemoryJournal(), runner=InlineRunner(), now=lambda: 1.0)
    final, _ = drive(state, deps)
    assert final.state == "failed"
    assert final.error.startswith("context budget: the prompt needs about")
    assert "context_tokens 2000" in final.error


def test_a_run_without_a_budget_sends_the_whole_transcript() -> None:
    limits = Limits(max_steps=30, max_tokens=100_000_000)
    state = new_run("1", limits=limits, now=0.0, task="Read the manual.")
    model = ReadingModel()
    deps = Deps(model=model, registry=TOOLS, journal=MemoryJournal(), runner=InlineRunner(), now=lambda: 1.0)
    final, transitions = drive(state, deps)
    assert not [t for t in transitions if t.kind == "compact"]
    assert "context_tokens" not in final.engine_json() and "token_scale" not in final.engine_json()
    assert model.requests[-1].messages == final.messages[: len(model.requests[-1].messages)]
