"""An MCP server's structured result with NaN, 1e400 (infinity) or nesting past the
limit (issue 34, item 7): the SDK decodes it, `jsonsafe.validate` refuses it, and the
call is a tool error the model sees instead of a row PostgreSQL cannot store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents.engine.registry import ToolError
from agents.tools.mcp import client


def deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize(
    "structured, named",
    [
        ({"total": float("inf")}, "inf at $.total is not a finite number"),
        ({"rows": [{"x": float("nan")}]}, "nan at $.rows[0].x is not a finite number"),
        ({"tree": deep(5000)}, "nested deeper than 64 levels"),
        ({"\ud800": 1}, "a key with a lone surrogate"),
    ],
)
def test_an_unstorable_structured_result_is_a_tool_error(monkeypatch, structured, named) -> None:
    # The server is the outside world: its answer, as the SDK hands it over, is faked.
    answer = SimpleNamespace(is_error=False, content=[], structured_content=structured)
    monkeypatch.setattr(client, "run_sync", lambda fn: answer)
    call = client.Call(
        conn=client.Connection(name="files", transport="stdio", command="unused"),
        mcp_name="lookup", pinned_sha256="", timeout=5, retry_safe=True,
    )
    with pytest.raises(ToolError) as raised:
        call({"record_id": "1"}, "key")
    assert raised.value.error == "invalid_result"
    assert raised.value.detail.startswith("server files returned unusable JSON: ") and named in raised.value.detail


def test_a_plain_structured_result_passes_unchanged(monkeypatch) -> None:
    structured = {"rows": [{"id": 1, "score": 0.5, "tags": ["a", None, True]}]}
    monkeypatch.setattr(client, "run_sync", lambda fn: SimpleNamespace(is_error=False, content=[], structured_content=structured))
    call = client.Call(
        conn=client.Connection(name="files", transport="stdio", command="unused"),
        mcp_name="lookup", pinned_sha256="", timeout=5, retry_safe=True,
    )
    found = call({"record_id": "1"}, "key")
    # The model reads it as the value; the gateway passes it through as structuredContent.
    assert found.value == structured and found.content == {"content": [], "structuredContent": structured}
