"""Built-in tools, one module each, and the tools of registered MCP servers (`mcp/`);
`registry()` returns the ones this deployment offers."""

from __future__ import annotations

import importlib
from collections.abc import Collection, Iterable
from typing import Any

from django.conf import settings

from agents.engine.registry import PATTERN, Registry, ToolSpec
from agents.lib.mcp_mapping import SEPARATOR
from agents.models import McpServer, McpTool

from . import demo, diagnostic, http, mail, mcp


def built_in() -> list[ToolSpec]:
    """The tools every deployment offers, in the order models are shown them."""
    kb_search, refund, export_customers = demo.TOOLS
    return [kb_search, *http.TOOLS, *mail.TOOLS, refund, export_customers]


def _local() -> list[ToolSpec]:
    """The tools that need no database: the built-in ones, and with scripted runs
    allowed the diagnostic and extra ones."""
    specs = built_in()
    if settings.AIRLOCK_ALLOW_SCRIPTED:
        specs += diagnostic.TOOLS
        for name in settings.AIRLOCK_EXTRA_TOOLS:
            specs += importlib.import_module(name).TOOLS
    return specs


def local_names() -> list[str]:
    """The names of the tools that need no database (for a profile's clean())."""
    return [spec.name for spec in _local()]


def unknown_names(names: Iterable[str]) -> list[str]:
    """The entries of a profile's tool list that name nothing here: neither a tool that
    needs no database, nor a pinned MCP tool (whatever its status: one waiting to be
    accepted again is still the profile's), nor `SERVER__*` of a registered server."""
    names = list(names)
    known = set(local_names())
    mcp = [n for n in names if SEPARATOR in n and n not in known]
    servers = [n[: -len(PATTERN)] for n in mcp if n.endswith(PATTERN)]
    if servers:
        registered = McpServer.objects.filter(name__in=servers).values_list("name", flat=True)
        known |= {f"{name}{PATTERN}" for name in registered}
    if mcp:
        known |= set(McpTool.objects.filter(name__in=mcp).values_list("name", flat=True))
    return [n for n in names if n not in known]


def registry(tools: Collection[str] | None = None) -> Registry:
    """The tools on offer; with `tools` (a run's snapshotted names, or a profile's names
    and `NAME__*` patterns), the MCP tools among them only: the built-in ones cost
    nothing, an MCP tool costs a row and a spec."""
    reg = Registry(_local())
    for spec in mcp.specs(tools):
        # `NAME__tool` cannot collide with a built-in name, which has no `__`.
        reg.add(spec)
    return reg


def registry_for(profile: Any, tools: Collection[str] | None = None) -> Registry:
    """registry(tools) with the profile's client tools (an external profile's
    `client_tools`). A launch refuses a client tool named like a registered one, so a
    name means one tool; were one added since, the registered tool keeps the name."""
    reg = OnDemand(profile, tools)
    reg.read()
    return reg


class OnDemand(Registry):
    """`registry_for(profile, tools)` that reads the MCP tools only once it is asked for
    one of them (a name with `__`) or for the whole listing: an external run's proposal
    of a built-in or client tool reads none."""

    def __init__(self, profile: Any, tools: Collection[str] | None = None) -> None:
        super().__init__(_local())
        self._tools, self._read = tools, False
        for spec in profile.client_specs():
            if spec.name not in self._specs:
                self.add(spec)

    def read(self) -> None:
        """Read the MCP tools now (once): each over a client tool of its name, since the
        registered tool keeps the name."""
        if self._read:
            return
        self._read = True
        for spec in mcp.specs(self._tools):
            self.add(spec)

    def get(self, name: str) -> ToolSpec | None:
        if SEPARATOR in name:
            self.read()
        return super().get(name)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and SEPARATOR in name:
            self.read()
        return super().__contains__(name)

    def names(self) -> list[str]:
        self.read()
        return super().names()

    def expand(self, names: Iterable[str] | None) -> list[str] | None:
        self.read()
        return super().expand(names)

    def subset(self, names: Iterable[str] | None) -> Registry:
        self.read()
        return super().subset(names)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.read()
        return super().__iter__()
