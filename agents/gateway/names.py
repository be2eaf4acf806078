"""One server's own names (`AgentProfile.expose_names`, docs/gateway.md): a profile whose
tools are one MCP server's lists them as that server does (`lookup`, not `web__lookup`),
so a client's prompts and docs written for the server keep working. Only the names the
client sees change: every call is proposed, policed, journaled and shown to reviewers
under the name Airlock governs it by (`SERVER__tool`)."""

from __future__ import annotations

from agents.models import AgentProfile, McpTool


def listed(profile: AgentProfile, governed_name: str, upstream_name: str | None) -> str:
    """The name tools/list shows for a tool: the upstream's own (`upstream_name`, the
    pinned `McpTool.mcp_name`) when the profile keeps its server's names."""
    if upstream_name is not None and profile.exposed_server() is not None:
        return upstream_name
    return governed_name


def governed(profile: AgentProfile, name: str) -> str | None:
    """The `SERVER__tool` a tools/call's `name` stands for: `name` itself unless the
    profile keeps its server's names; then the server's tool of that upstream name
    (None for a name the server has no tool of: the prefixed form is not in the
    listing, so it is refused as any unlisted name is)."""
    server = profile.exposed_server()
    if server is None:
        return name
    # The tool's row, not `server + "__" + name`: a name with characters providers
    # refuse, or a long one, was renamed at sync (mapping.tool_name).
    return McpTool.objects.filter(server__name=server, mcp_name=name).values_list("name", flat=True).first()
