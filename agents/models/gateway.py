"""The MCP gateway's callers (agents/gateway/): a caller's stream of runs, and the
sessions of clients that speak the handshake era."""

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

    Since the fourth round a session is a convenience: its calls belong to the caller's
    stream (`GatewayStream`, under the session's `stream_key`), and `run` is set only
    when `initialize` pinned one with `Airlock-Run`. No guarantee depends on a session.
    """

    session_id = models.CharField(max_length=64, unique=True)
    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    launched_run = models.BooleanField(default=False, help_text="the session launched its run (not Airlock-Run)")
    client_name = models.CharField(max_length=200, blank=True, help_text="clientInfo of the initialize request")
    protocol_version = models.CharField(max_length=20, blank=True)
    stream_key = models.CharField(
        max_length=200, blank=True, db_default="", help_text="the conversation key sent at initialize ('' for none)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True, help_text="the client ended the session (DELETE)")

    def __str__(self) -> str:
        return f"MCP session {self.session_id[:8]} of {self.profile_id} (run {self.run_id})"


class GatewayStream(models.Model):
    """A caller of `/mcp/<profile>/`: the token's user, the profile and the conversation
    key the client sent (`Airlock-Conversation`, or `_meta["airlock/conversation"]`;
    '' when it sent none). Whatever connection or era a call arrives on, it goes to the
    stream's current `run`; when that run ends (budget, deadline, idle time), the
    stream's next call launches one that continues it (`Run.continues`), carrying its
    taint (docs/gateway.md, "Streams")."""

    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=200, blank=True)
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            db_index=False)
    client_name = models.CharField(max_length=200, blank=True, help_text="the client that opened the stream")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "profile", "key"], name="gatewaystream_caller")]

    def __str__(self) -> str:
        return f"gateway stream of {self.user_id} on {self.profile_id} ({self.key or 'default'}): run {self.run_id}"


class GatewayTask(models.Model):
    """A held call handed to its client as a task (the MCP tasks extension,
    `io.modelcontextprotocol/tasks`, in the 2026-07-28 era): the client polls
    `tasks/get` with `task_id` until the call's outcome is in, from any connection or
    web process, and may withdraw it with `tasks/cancel` (docs/gateway.md, "Tasks").

    The row is the task: it names the call (its run and key) and whose it is; the
    call's status, result and the reviewer's note are read from the run each time, so
    nothing a task answers lives in a process. One task per call: the same call held
    again (from any connection) answers the same task."""

    task_id = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    profile = models.ForeignKey("agents.AgentProfile", on_delete=models.CASCADE, related_name="+", db_index=False)
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=200, help_text="the call's idempotency key in its run")
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True, help_text="the client withdrew the call (tasks/cancel)")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="gatewaytask_call")]

    def __str__(self) -> str:
        return f"gateway task {self.task_id[:8]} of run {self.run_id} ({self.key[:12]})"
