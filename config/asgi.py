"""The ASGI door: Django for everything, except `/mcp/`, which the MCP gateway's own
ASGI application answers (agents/gateway/app.py; under WSGI the same application runs
behind a Django view, agents/gateway/bridge.py). A token's request to `/api/` goes to
Django without a browser's middleware (agents/ops/doors.py)."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_asgi_application()

from agents.gateway.app import application as gateway_application  # noqa: E402 - after Django's setup
from agents.ops.doors import TokenAPIASGIHandler, is_token_request  # noqa: E402 - after Django's setup

token_api_application = TokenAPIASGIHandler()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        # Django answers no lifespan events; the gateway starts on its first request.
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http" and scope["path"].startswith("/mcp/"):
        await gateway_application(scope, receive, send)
        return
    if scope["type"] == "http" and is_token_request(scope["path"], _authorization(scope)):
        await token_api_application(scope, receive, send)
        return
    await django_application(scope, receive, send)


def _authorization(scope: dict[str, Any]) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bytes(value)
    return None
