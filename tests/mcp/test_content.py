"""What of an MCP tool's result the journal keeps to pass through (content.kept): the
blocks as sent within the journal's limit, a block past it named instead, and nothing
extra for a plain text result."""

from __future__ import annotations

import json

import mcp_types as types

from agents.tools.mcp import content
from agents.tools.mcp.client import content_text


def result(*blocks: types.ContentBlock, structured: dict | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=list(blocks), structured_content=structured)


def test_a_plain_text_result_keeps_nothing_beside_its_summary() -> None:
    sent = result(types.TextContent(type="text", text="a"), types.TextContent(type="text", text="b"))
    assert content.kept(sent, content_text(sent.content), 1_000_000) is None


def test_an_image_too_large_for_the_journal_is_named_and_the_rest_is_kept() -> None:
    big = types.ImageContent(type="image", data="A" * 600_000, mime_type="image/png")
    small = types.ImageContent(type="image", data="iVBORw0K", mime_type="image/png")
    sent = result(types.TextContent(type="text", text="two pictures"), big, small, structured={"n": 2})
    summary = content_text(sent.content)
    kept = content.kept(sent, summary, 500_000)
    assert kept is not None
    assert [b["type"] for b in kept["content"]] == ["text", "text", "image"]
    assert kept["content"][1]["text"].startswith("[airlock: image image/png, 600,0")
    assert "AIRLOCK_JOURNAL_MAX_CHARS" in kept["content"][1]["text"]
    assert kept["content"][2] == {"type": "image", "data": "iVBORw0K", "mimeType": "image/png"}
    assert kept["structuredContent"] == {"n": 2}
    assert len(json.dumps({"ok": True, "result": summary, "content": kept})) <= 500_000


def test_when_not_even_the_names_fit_the_summary_stands_alone() -> None:
    sent = result(types.ImageContent(type="image", data="A" * 1000, mime_type="image/png"))
    assert content.kept(sent, content_text(sent.content), 150) is None
