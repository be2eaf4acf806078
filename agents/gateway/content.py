"""What a tools/call answers with when the upstream sent more than text (docs/gateway.md,
"Content passes through"): the upstream's content blocks (images, audio, embedded
resources, resource links, text) and its structured content, as the journal kept them
(`agents/tools/mcp/content.py`, within the journal's limit), instead of the text
summary the run's transcript holds."""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from pydantic import ValidationError

log = logging.getLogger("airlock.gateway")


def sent(result: Any) -> dict[str, Any] | None:
    """The upstream's own content of a journaled success (`{"ok": true, "result":
    summary, "content": {"content": [...], "structuredContent"?: ...}}`), or None
    when the journal holds only the summary (a text result, a built-in tool)."""
    found = result.get("content") if isinstance(result, dict) and result.get("ok") is True else None
    if not isinstance(found, dict) or not isinstance(found.get("content"), list):
        return None
    return found


def blocks(kept: dict[str, Any] | None, note: str = "") -> list[dict[str, Any]] | None:
    """The blocks to answer with (a text block saying `note` first), or None: answer
    with the summary's text."""
    if kept is None:
        return None
    return ([{"type": "text", "text": note}] if note else []) + list(kept["content"])


def structured(kept: dict[str, Any] | None, airlock: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The upstream's structured content, with Airlock's own word (`airlock`) beside
    its keys when Airlock has something to say (an edited call)."""
    upstream = kept.get("structuredContent") if kept is not None else None
    if airlock is None:
        return upstream if isinstance(upstream, dict) else None
    return {**(upstream if isinstance(upstream, dict) else {}), **airlock}


def call_result(text: str, is_error: bool, structured_content: dict[str, Any] | None,
                content: list[dict[str, Any]] | None) -> types.CallToolResult:
    """The CallToolResult: the upstream's blocks when kept, else one text block."""
    if content is not None:
        try:
            return types.CallToolResult.model_validate(
                {"content": content, "structuredContent": structured_content, "isError": is_error})
        except ValidationError:
            # A block this SDK cannot express (a newer kind): the summary says it in text.
            log.warning("an upstream's content could not be passed through; answering with its text")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured_content, is_error=is_error)
