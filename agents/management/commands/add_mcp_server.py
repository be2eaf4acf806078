from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.tools.mcp import McpError, mcp_server_add


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"{what} takes KEY=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


class Command(BaseCommand):
    help = (
        "Register an MCP server whose tools runs may use as NAME__tool (then run mcp_sync NAME). "
        "Secrets stay out of the database: write an --env value as ${VAR} and give --header "
        "the name of an environment variable; the worker reads them when it connects."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="letters, digits, '-' and single '_'; at most 24 characters")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--command", help='stdio: the command line the worker starts, e.g. "python server.py"')
        source.add_argument("--url", help="streamable HTTP: the endpoint, e.g. https://tools.example.com/mcp")
        parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                            help="stdio: an environment variable for the server (VALUE ${VAR}: the worker's VAR)")
        parser.add_argument("--header", action="append", default=[], metavar="NAME=ENV_VAR",
                            help="HTTP: a request header whose value is the worker's ENV_VAR")
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")

    def handle(self, *args: Any, name: str, command: str | None, url: str | None, env: list[str],
               header: list[str], timeout: float, **options: Any) -> None:
        try:
            server = mcp_server_add(
                name=name,
                command=command or "",
                url=url or "",
                env=_pairs(env, "--env"),
                headers=_pairs(header, "--header"),
                timeout=timeout,
            )
        except McpError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Registered MCP server {server.name} ({server.transport}: {server.target()}).")
        self.stdout.write(f"List its tools with: manage.py mcp_sync {server.name}")
