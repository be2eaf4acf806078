"""The upstream the conformance test puts behind the gateway: an MCP server built with
the official SDK's low-level server, offering the tools the official conformance
suite's server scenarios call, under the suite's names (and `structured_record`) (the gateway's profile keeps
them: `expose_names`). Each tool is a read (`readOnlyHint`, closed world), so Airlock's
policy lets it run without a reviewer. Streamable HTTP on 127.0.0.1; prints "listening
URL" once bound; exits after --max-seconds whatever happens (the tests' safety net).

    python tests/gateway/conformance/upstream.py --port 0
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import socket
import threading
import wave
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--max-seconds", type=float, default=600)
options = parser.parse_args()

# A 1x1 red PNG, and a tenth of a second of silence as 8 kHz mono WAV.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
_wav = io.BytesIO()
with wave.open(_wav, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(1)
    w.setframerate(8000)
    w.writeframes(b"\x80" * 800)
WAV = base64.b64encode(_wav.getvalue()).decode()

READ = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
TOOLS = {
    "test_simple_text": "Returns simple text.",
    "test_image_content": "Returns a PNG image.",
    "test_audio_content": "Returns a WAV recording.",
    "test_embedded_resource": "Returns an embedded text resource.",
    "test_multiple_content_types": "Returns text, an image and an embedded resource.",
    "test_error_handling": "Always fails: answers with isError.",
    "test_tool_with_logging": "Sends three log messages while it runs.",
    "test_tool_with_progress": "Reports progress three times while it runs.",
    "json_schema_2020_12_tool": "Tool with JSON Schema 2020-12 features",
    # Not the suite's: for tests/gateway/test_content.py.
    "structured_record": "Returns a record as text, a resource link and structured content.",
}


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG, mime_type="image/png")


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name=name, description=description, annotations=READ,
                   input_schema=SCHEMA_2020_12 if name == "json_schema_2020_12_tool" else NO_ARGS)
        for name, description in TOOLS.items()
    ])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    name = params.name
    if name == "test_simple_text":
        return types.CallToolResult(content=[text("This is a simple text response for testing.")])
    if name == "test_image_content":
        return types.CallToolResult(content=[image()])
    if name == "test_audio_content":
        return types.CallToolResult(content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")])
    if name == "test_embedded_resource":
        return types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."))])
    if name == "test_multiple_content_types":
        return types.CallToolResult(content=[
            text("Multiple content types test:"), image(),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json", text='{"test":"data","value":123}')),
        ])
    if name == "test_error_handling":
        return types.CallToolResult(content=[text("This tool intentionally returns an error for testing")],
                                    is_error=True)
    if name == "test_tool_with_logging":
        for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await ctx.session.send_log_message(level="info", data=message)
            await anyio.sleep(0.05)
        return types.CallToolResult(content=[text("Logging test completed")])
    if name == "test_tool_with_progress":
        for done in (0, 50, 100):
            await ctx.session.report_progress(done, 100)
            await anyio.sleep(0.05)
        return types.CallToolResult(content=[text("Progress test completed")])
    if name == "structured_record":
        return types.CallToolResult(
            content=[text('{"id": 7, "name": "alpha"}'),
                     types.ResourceLink(type="resource_link", uri="test://records/7", name="record 7")],
            structured_content={"id": 7, "name": "alpha"})
    if name == "json_schema_2020_12_tool":
        return types.CallToolResult(content=[text(f"received {params.arguments or {}}")])
    return types.CallToolResult(content=[text(f"unknown tool {name}")], is_error=True)


server = Server("airlock-conformance-upstream", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    import uvicorn

    timer = threading.Timer(options.max_seconds, lambda: os._exit(0))
    timer.daemon = True
    timer.start()
    app = server.streamable_http_app(host="127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", options.port))
    sock.listen(64)
    print(f"listening http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])
    os._exit(0)


if __name__ == "__main__":
    main()
