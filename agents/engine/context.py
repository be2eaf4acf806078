"""Context management for long runs: fold older tool results out of the prompt.

A run with a budget (`context_tokens`, from its profile) never sends a prompt estimated
above it. When the next prompt would be, the engine takes a `compact` transition first:
the oldest tool results, up to a message index (`folded_before`), are replaced in the
prompt by short stubs. The transcript itself stays complete (nothing is deleted or
rewritten), the stubs are derived from it, and the index lives in the engine state, so
a replay of the transitions gives the same prompt.

What is never folded: the system prompt and the task (they are not tool results), and
the last `KEEP_TURNS` assistant turns with everything after them, which always holds the
calls still being answered. A stub keeps its message, role and `tool_call_id`, so no call
is ever separated from its result: providers reject a call without its result.

Tokens are estimated from characters (`CHARS_PER_TOKEN`), then corrected by the ratio of
the provider's reported input tokens to the estimate of the prompt it was sent
(`scale`, per mille, updated after every model call with usage).

Compaction folds down to `TARGET` of the budget, not just under it: the prompt then
grows for several steps before the next compaction, and between compactions each step's
prompt is a prefix of the next one's, which the providers' prompt caches reuse.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .registry import ToolSpec

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # tokens a chat template adds around each message
KEEP_TURNS = 2
TARGET = 0.75
SCALE_ONE = 1000  # `scale` is per mille: 1000 means the estimate is right
STUB_PREVIEW = 60


def stub(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    preview = " ".join(content[:STUB_PREVIEW].split())
    return (
        f"[airlock: this earlier result of {message.get('name') or 'a tool'} ({len(content):,} characters) "
        f"was folded to fit the context budget; it began: {preview}]"
    )


def folds(message: dict[str, Any]) -> bool:
    """Whether this message becomes a stub once it is before `folded_before`: a tool
    result longer than its stub (folding a shorter one would gain nothing)."""
    return message.get("role") == "tool" and len(stub(message)) < len(message.get("content") or "")


def prompt(messages: list[dict[str, Any]], folded_before: int) -> list[dict[str, Any]]:
    """The messages the model is sent: tool results before `folded_before` as stubs."""
    if not folded_before:
        return list(messages)
    return [{**m, "content": stub(m)} if i < folded_before and folds(m) else m for i, m in enumerate(messages)]


def raw_tokens(messages: Iterable[dict[str, Any]], tools: Iterable[ToolSpec] = ()) -> int:
    """The uncorrected estimate of a prompt: its characters / CHARS_PER_TOKEN."""
    total = 0
    for m in messages:
        chars = len(m.get("content") or "")
        if m.get("tool_calls"):
            chars += len(json.dumps(m["tool_calls"], ensure_ascii=False, default=str))
        total += math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD
    for t in tools:
        total += math.ceil(len(json.dumps(t.openapi(), ensure_ascii=False)) / CHARS_PER_TOKEN)
    return total


def scaled(raw: int, scale: int | None) -> int:
    return math.ceil(raw * (scale or SCALE_ONE) / SCALE_ONE)


def corrected_scale(reported_input: int, raw: int) -> int:
    """The per-mille correction that makes `raw` match what the provider counted,
    bounded so one odd report cannot make the estimate absurd."""
    if raw <= 0 or reported_input <= 0:
        return SCALE_ONE
    return max(250, min(4000, math.ceil(reported_input * SCALE_ONE / raw)))


@dataclass(frozen=True)
class Compaction:
    folded_before: int
    folded: list[str]  # tool_call_ids whose results are now stubs
    tokens_before: int
    tokens_after: int


class OverBudget(Exception):
    """Even with every foldable result folded, the prompt does not fit the budget."""

    def __init__(self, tokens: int) -> None:
        super().__init__(tokens)
        self.tokens = tokens


def plan(
    messages: list[dict[str, Any]],
    tools: list[ToolSpec],
    *,
    budget: int,
    folded_before: int,
    scale: int | None,
) -> Compaction | None:
    """The compaction the next prompt needs, or None when it fits the budget.

    Raises OverBudget when folding everything allowed still leaves it too long.
    """
    current = prompt(messages, folded_before)
    before = scaled(raw_tokens(current, tools), scale)
    if before <= budget:
        return None
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    limit = assistants[-KEEP_TURNS] if len(assistants) >= KEEP_TURNS else 0
    target = math.floor(budget * TARGET)
    raw = raw_tokens(current, tools)
    boundary, folded = folded_before, []
    for i in range(folded_before, limit):
        if scaled(raw, scale) <= target:
            break
        boundary = i + 1
        m = messages[i]
        if not folds(m):
            continue
        folded.append(str(m.get("tool_call_id", "")))
        raw -= math.ceil(len(m.get("content") or "") / CHARS_PER_TOKEN)
        raw += math.ceil(len(stub(m)) / CHARS_PER_TOKEN)
    after = scaled(raw, scale)
    if after > budget:
        raise OverBudget(after)
    return Compaction(folded_before=boundary, folded=folded, tokens_before=before, tokens_after=after)
