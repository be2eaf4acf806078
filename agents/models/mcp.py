"""MCP servers as tool sources and their pinned tool definitions."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from agents.lib.mcp_mapping import Kind, annotated_kind, server_name_problem
from agents.models.fields import URLField


def _validate_server_name(value: str) -> None:
    problem = server_name_problem(value)
    if problem:
        raise ValidationError(problem)


class McpServer(models.Model):
    """An MCP server whose tools Airlock offers as `NAME__tool`.

    Secrets never live here: a stdio environment value written `${VAR}` and every HTTP
    header value are read from the worker's environment variable of that name per call.
    """

    TRANSPORTS = [("stdio", "stdio (a command the worker starts)"), ("http", "streamable HTTP")]

    name = models.CharField(max_length=24, unique=True, validators=[_validate_server_name])
    transport = models.CharField(max_length=10, choices=TRANSPORTS)
    command = models.TextField(blank=True, help_text="stdio: the command line (split like a shell does)")
    url = URLField(max_length=500, blank=True, help_text="streamable HTTP: the endpoint")
    env = models.JSONField(
        default=dict, blank=True, help_text='stdio: {"KEY": "value"}; a value "${VAR}" is read from the worker\'s VAR'
    )
    headers = models.JSONField(
        default=dict, blank=True, help_text='HTTP: {"Header-Name": "ENV_VAR"}; the value comes from that variable'
    )
    timeout_seconds = models.FloatField(default=30.0, help_text="per call, connecting included")
    enabled = models.BooleanField(default=True)
    synced_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:

        if self.transport == "stdio" and (not self.command.strip() or self.url):
            raise ValidationError("a stdio server has a command and no URL")
        if self.transport == "http" and (not self.url or self.command):
            raise ValidationError("a streamable HTTP server has a URL and no command")
        if self.transport == "http" and self.env:
            raise ValidationError("env sets a stdio server's environment; an HTTP server takes headers")
        if self.transport == "stdio" and self.headers:
            raise ValidationError("headers are for HTTP servers")

    def target(self) -> str:
        return self.url if self.transport == "http" else self.command


class McpTool(models.Model):
    """One tool of an MCP server, pinned to the definition an operator accepted.

    The server's annotations are its self-description, hints only; the `*_override` fields are the operator's
    word and win. A sync that finds a different definition parks it in `pending_*` and
    sets `status` to `changed`: the tool is not offered until someone accepts it.
    """

    STATUSES = [
        ("active", "active"),
        ("changed", "changed: disabled until accepted"),
        ("removed", "removed from the server"),
        ("invalid", "invalid input schema"),
    ]
    RISKS = [(r, r) for r in ("read", "write", "irreversible")]
    RETURNS = [(r, r) for r in ("internal", "external")]
    RETRY = [(r, r) for r in ("safe", "unsafe")]

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    mcp_name = models.CharField(max_length=200, help_text="the name the server uses")
    name = models.CharField(max_length=64, unique=True, help_text="the name the model sees: SERVER__tool")
    name_note = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    sha256 = models.CharField(max_length=64, help_text="of the accepted definition")
    status = models.CharField(max_length=10, choices=STATUSES, default="active")
    pending_definition = models.JSONField(null=True, blank=True, editable=False)
    pending_sha256 = models.CharField(max_length=64, blank=True, editable=False)
    risk_override = models.CharField(max_length=12, choices=RISKS, blank=True)
    returns_override = models.CharField(max_length=10, choices=RETURNS, blank=True)
    retry_safety_override = models.CharField(max_length=6, choices=RETRY, blank=True)
    timeout_seconds = models.FloatField(null=True, blank=True, help_text="empty: the server's")
    enabled = models.BooleanField(default=True, help_text="the operator's switch")
    synced_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["server", "mcp_name"], name="mcp_tool_server_name")]

    def __str__(self) -> str:
        return self.name

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.mcp_name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": self.annotations,
        }

    def annotated(self) -> Any:
        """The kind the server's annotations describe (its self-description)."""
        return annotated_kind(self.annotations)

    def effective(self) -> Any:
        """The kind Airlock applies: the operator's overrides over the server's annotations."""
        annotated = self.annotated()
        return Kind(
            self.risk_override or annotated.risk,
            self.returns_override or annotated.returns,
            self.retry_safety_override or annotated.retry_safety,
        )

    def offered(self) -> bool:
        return self.status == "active" and self.enabled and self.server.enabled

    def timeout(self) -> float:
        return self.timeout_seconds if self.timeout_seconds is not None else self.server.timeout_seconds
