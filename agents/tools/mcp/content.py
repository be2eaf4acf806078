"""An MCP tool's result as it came: the content blocks (text, images, audio, embedded
resources, resource links) and the structured content the server sent, kept beside
the text summary the model reads (`client.content_text`), for the MCP gateway to pass
through (docs/gateway.md, "Content passes through").

Plain data, no Django: the caller gives the size limit (the journal's,
AIRLOCK_JOURNAL_MAX_CHARS), so a result with large images stays a result the journal
keeps whole; a block past the limit is named in a text block instead of sent.
"""

from __future__ import annotations

import json
from typing import Any

# Room left in the journal's limit for the result's other keys ({"ok": true, ...}).
HEADROOM = 200


def kept(result: Any, summary: Any, max_chars: int) -> dict[str, Any] | None:
    """`{"content": [block, ...], "structuredContent"?: {...}}` of an SDK
    `CallToolResult` (blocks as JSON, camelCase as on the wire), or None when the text
    summary says all of it: text blocks only, nothing structured, no annotations, so
    the journal of a plain text tool holds what it held before.

    Blocks are kept in order while they fit in `max_chars` less the summary; one that
    does not is replaced by a text block naming it (its kind, type and size) and the
    limit; structured content that does not fit is left out (the summary holds it when
    the server sent no text). When not even the names fit, None: the summary alone."""
    blocks = [b.model_dump(by_alias=True, exclude_none=True, mode="json") for b in result.content or ()]
    structured = result.structured_content
    if structured is None and all(set(b) == {"type", "text"} and b["type"] == "text" for b in blocks):
        return None
    budget = max_chars - len(json.dumps(summary, ensure_ascii=False, default=str)) - HEADROOM
    found: list[dict[str, Any]] = []
    for block in blocks:
        size = _size(block)
        if size > budget:
            block = {"type": "text", "text": f"[airlock: {_named(block)}, {size:,} characters, not passed through: "
                                             "over the journal's limit (AIRLOCK_JOURNAL_MAX_CHARS)]"}
            size = _size(block)
        budget -= size
        found.append(block)
    if budget < 0:
        return None  # not even the blocks' names fit: the summary alone, as for a text result
    kept_result: dict[str, Any] = {"content": found}
    if structured is not None and _size(structured) <= budget:
        kept_result["structuredContent"] = structured
    return kept_result


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def _named(block: dict[str, Any]) -> str:
    kind = str(block.get("type", "unknown"))
    if kind in ("image", "audio"):
        return f"{kind} {block.get('mimeType', '')}".strip()
    if kind == "resource":
        return f"resource {(block.get('resource') or {}).get('uri', '')}".strip()
    return f"{kind} content"
