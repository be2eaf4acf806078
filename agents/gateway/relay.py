"""An upstream's progress notifications, passed on to the gateway's client while its
call runs (docs/gateway.md, "Content passes through"): for a tools/call whose client
asked for progress (a `progressToken`), the upstream call Airlock makes within the
request (an allowed call, or an approved one the gateway runs itself) hears the
upstream's progress on the MCP pool's loop thread (agents/tools/mcp/client.py,
PROGRESS), and each notification is sent on, in order, on the client's answer stream
before the result. A call run elsewhere (a worker) or answered from the journal has
nothing to relay."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents.tools.mcp import client as mcp_client

Notice = tuple[float, float | None, str | None]


@contextlib.asynccontextmanager
async def relaying(ctx: Any) -> AsyncIterator[None]:
    """Within: the upstream's progress reaches `ctx`'s client (ctx.session.report_progress,
    which sends nothing to a client that asked for none). On leaving, every notification
    heard so far has been sent: the pool's thread hands each over with
    `call_soon_threadsafe` before its call returns, so they are queued ahead of the end."""
    loop = asyncio.get_running_loop()
    heard: asyncio.Queue[Notice | None] = asyncio.Queue()

    def listener(progress: float, total: float | None, message: str | None) -> None:
        loop.call_soon_threadsafe(heard.put_nowait, (progress, total, message))

    async def forward() -> None:
        while (notice := await heard.get()) is not None:
            # A client gone (its stream closed) must not fail the call: the result is
            # journaled either way, and the rest of the notices are drained unsent.
            with contextlib.suppress(Exception):
                await ctx.session.report_progress(*notice)

    sender = loop.create_task(forward())
    token = mcp_client.PROGRESS.set(listener)
    try:
        yield
    finally:
        mcp_client.PROGRESS.reset(token)
        heard.put_nowait(None)
        await sender


def relayed(handler: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """`handler` (the gateway's tools/call) with the upstream's progress relayed while it
    runs, when its client asked for progress."""

    async def call(ctx: Any, params: Any) -> Any:
        if not wants_progress(params):
            return await handler(ctx, params)
        async with relaying(ctx):
            return await handler(ctx, params)

    return call


def wants_progress(params: Any) -> bool:
    meta = getattr(params, "meta", None)
    return isinstance(meta, dict) and ("progress_token" in meta or "progressToken" in meta)
