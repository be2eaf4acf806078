"""The floor under the gateway's figure: an MCP pass-through proxy built with the official
SDK the way the gateway is (a low-level `Server` behind a stateless
`StreamableHTTPSessionManager` answering JSON, the SDK's `Client` to the upstream), with
nothing of Airlock's: no token, no session row, no policy, no journal, no database.

    python bench/sdk_proxy.py UPSTREAM_URL      # prints "listening URL" once bound

It offers the upstream's tools under `bench__NAME` (as the gateway names them) and
forwards each call over one upstream session kept open on its own event loop. What a
call through it costs over a direct call is what the SDK's two extra hops (a server and
a client) cost before any gateway work: bench/gateway.py measures it beside the gateway.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

PREFIX = "bench__"
MAX_SECONDS = 1800  # a safety net: never outlive a forgotten bench by long


class Upstream:
    """One SDK client session to the upstream, opened at start and kept."""

    client: Client

    def __init__(self, url: str) -> None:
        self.url = url
        self.schemas: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0))
        async with http, Client(streamable_http_client(self.url, http_client=http), cache=None) as client:
            self.client = client
            # Listed once: the SDK's server checks a call's Mcp-Param headers against its
            # tool's schema, and without `get_tool_input_schema` it would list the tools
            # (here: a round trip upstream) on every call to find it.
            self.schemas.update({PREFIX + t.name: t.input_schema for t in (await client.list_tools()).tools})
            yield


def build(upstream: Upstream) -> Any:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        listed = await upstream.client.list_tools()
        return types.ListToolsResult(tools=[t.model_copy(update={"name": PREFIX + t.name}) for t in listed.tools])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await upstream.client.call_tool(params.name.removeprefix(PREFIX), params.arguments or {})

    server = Server("bench-sdk-proxy", on_list_tools=list_tools, on_call_tool=call_tool,
                    get_tool_input_schema=upstream.schemas.get)
    manager = StreamableHTTPSessionManager(server, stateless=True, json_response=True)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async with upstream.opened(), manager.run():
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif message["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
        await manager.handle_request(scope, receive, send)

    return app


def main() -> None:
    upstream = Upstream(sys.argv[1])
    # IPPROTO_TCP named, as examples/mcp_server.py explains: TCP_NODELAY on accepted sockets.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"listening http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    server = uvicorn.Server(uvicorn.Config(build(upstream), log_level="warning", lifespan="on"))

    async def serve() -> None:
        with anyio.move_on_after(MAX_SECONDS):
            await server.serve(sockets=[sock])

    anyio.run(serve)


if __name__ == "__main__":
    main()
