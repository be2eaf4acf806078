"""The MCP gateway's sessions (agents/gateway/): which run an MCP session drives."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class GatewaySession(models.Model):
    """One MCP session of `/mcp/<profile>/`, under the `Mcp-Session-Id` the gateway
    minted at `initialize`.

    The row, not a web process's memory, is the session: any process (any gunicorn
    worker, any host) that receives the next request finds it here, so a session
    survives a request landing elsewhere. `run` is set by the session's first
    `tools/call` (or at `initialize` by an `Airlock-Run` header) and never changes.
    """

    session_id = models.CharField(max_length=64, unique=True)
    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    launched_run = models.BooleanField(default=False, help_text="the session launched its run (not Airlock-Run)")
    client_name = models.CharField(max_length=200, blank=True, help_text="clientInfo of the initialize request")
    protocol_version = models.CharField(max_length=20, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True, help_text="the client ended the session (DELETE)")

    def __str__(self) -> str:
        return f"MCP session {self.session_id[:8]} of {self.profile_id} (run {self.run_id})"
