"""An MCP server (the official SDK's low-level server, over stdio) that lists whatever
tools a JSON file holds, schemas and all: the hostile listings of issue 34 (a `$ref` to a
URL or a file, a `$ref` cycle, thousands of tools, huge descriptions).

    python tests/mcp/listing_server.py TOOLS.json

TOOLS.json: a list of {"name", "description"?, "inputSchema"?, "outputSchema"?,
"annotations"?, "structuredContent"?}. A call answers "ok", or the tool's
`structuredContent` (as structured content and as its JSON text).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

with open(sys.argv[1], encoding="utf-8") as f:
    LISTED: list[dict[str, Any]] = json.load(f)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=t["name"],
                description=t.get("description"),
                input_schema=t.get("inputSchema") or {"type": "object"},
                output_schema=t.get("outputSchema"),
                annotations=types.ToolAnnotations(**t["annotations"]) if t.get("annotations") else None,
            )
            for t in LISTED
        ]
    )


async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    tool = next((t for t in LISTED if t["name"] == params.name), {})
    if "structuredContent" in tool:
        structured = tool["structuredContent"]
        text = types.TextContent(type="text", text=json.dumps(structured))
        return types.CallToolResult(content=[text], structured_content=structured)
    return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])


server = Server("airlock-listing", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
