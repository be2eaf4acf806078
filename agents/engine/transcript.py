"""What the model reads of a tool's result: its text, capped, and the statement that a
reviewer changed the call's arguments."""

from __future__ import annotations

import json
from typing import Any

TRANSCRIPT_CAP = 8_000


def tool_message(call: dict[str, Any], result: Any) -> dict[str, Any]:
    text = result_text(result)
    if call.get("edited"):
        # The model proposed other arguments: it must not read this result as the
        # outcome of its own call.
        text = edit_statement(call) + "\n" + text
    return {"role": "tool", "tool_call_id": call["id"], "name": call["tool"], "content": cap(text)}


def edit_statement(call: dict[str, Any]) -> str:
    edit = call["edited"]
    who = f" ({edit['by']})" if edit.get("by") else ""
    why = f" Their note: {edit['note']}" if edit.get("note") else ""
    return (
        f"[airlock: a human reviewer{who} changed the arguments of this call before approving it. "
        f"You proposed {json.dumps(edit['from'], ensure_ascii=False, sort_keys=True)}; "
        f"it ran with {json.dumps(call['args'], ensure_ascii=False, sort_keys=True)}.{why}]"
    )


def result_text(result: Any) -> str:
    """What the model reads: a success's value (text as is), an error as JSON."""
    if isinstance(result, dict) and result.get("ok") is True and "result" in result:
        value = result["result"]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return json.dumps(result, ensure_ascii=False, default=str)


def cap(text: str, limit: int = TRANSCRIPT_CAP) -> str:
    if len(text) <= limit:
        return text
    return (
        text[:limit]
        + f"\n[airlock: result truncated, {len(text) - limit} more characters; "
        + "the full result is in the tool-call journal]"
    )
