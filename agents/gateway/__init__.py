"""The MCP gateway, `/mcp/<profile>/` (docs/gateway.md): an MCP server over streamable
HTTP whose tools are an external profile's, each call proposed through the decision API
(`agents.actions.external`). core.py (the Django side: callers, sessions, tools, calls), app.py
(the ASGI application: the HTTP front and the SDK's server), bridge.py (the same
application behind WSGI, on an event loop thread per process)."""
