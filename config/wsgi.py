"""The WSGI door (what gunicorn serves): Django for everything, except `/mcp/`, which
goes straight to the MCP gateway (agents/gateway/bridge.py), as `config.asgi` sends it
to the gateway's ASGI application: the gateway checks its Host, token and body itself,
and nothing of Django's request handling (sessions, CSRF, messages) is for it. A token's
request to `/api/` goes to Django without a browser's middleware (agents/ops/doors.py)."""

import os
from typing import Any

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_wsgi_application()

from agents.gateway import bridge  # noqa: E402 - after Django's setup
from agents.ops.doors import TokenAPIWSGIHandler, is_token_request  # noqa: E402 - after Django's setup

token_api_application = TokenAPIWSGIHandler()


def application(environ: dict[str, Any], start_response: Any) -> Any:
    if environ.get("PATH_INFO", "").startswith("/mcp/"):
        return bridge.application(environ, start_response)
    if is_token_request(environ.get("PATH_INFO", ""), environ.get("HTTP_AUTHORIZATION")):
        return token_api_application(environ, start_response)
    return django_application(environ, start_response)
