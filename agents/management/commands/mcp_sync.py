from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.models import McpServer
from agents.tools.mcp import McpError, mcp_server_sync


class Command(BaseCommand):
    help = (
        "List an MCP server's tools and pin them: one line per tool with the risk, returns and "
        "retry safety Airlock applies. A changed definition disables its tool until accepted in the admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        server = McpServer.objects.filter(name=name).first()
        if server is None:
            known = ", ".join(McpServer.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"no MCP server named {name!r} (known: {known})")
        try:
            lines = mcp_server_sync(server=server)
        except McpError as exc:
            raise CommandError(f"could not list the tools of {name}: {exc}") from None
        for line in lines:
            self.stdout.write(str(line))
        for note in lines.notes:
            self.stdout.write(note)
        if not lines:
            self.stdout.write(f"{name} lists no tools.")
