"""Built-in tools, one module each, and the tools of registered MCP servers (`mcp/`);
`registry()` returns the ones this deployment offers."""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import Any

from django.conf import settings

from agents.engine.registry import Registry, ToolSpec


def built_in() -> list[ToolSpec]:
    """The tools every deployment offers, in the order models are shown them."""
    from . import demo, http, mail

    kb_search, refund = demo.TOOLS
    return [kb_search, *http.TOOLS, *mail.TOOLS, refund]


def registry(tools: Collection[str] | None = None) -> Registry:
    """The tools on offer; with `tools` (a run's snapshotted names), the MCP tools among
    them only: the built-in ones cost nothing, an MCP tool costs a row and a spec."""
    from . import diagnostic

    reg = Registry()
    for spec in built_in():
        reg.add(spec)
    if settings.AIRLOCK_ALLOW_SCRIPTED:
        for spec in diagnostic.TOOLS:
            reg.add(spec)
    for name in settings.AIRLOCK_EXTRA_TOOLS if settings.AIRLOCK_ALLOW_SCRIPTED else []:
        for spec in importlib.import_module(name).TOOLS:
            reg.add(spec)
    from . import mcp

    for spec in mcp.specs(tools):
        # `NAME__tool` cannot collide with a built-in name, which has no `__`.
        reg.add(spec)
    return reg


def registry_for(profile: Any, tools: Collection[str] | None = None) -> Registry:
    """registry(tools) with the profile's client tools (an external profile's
    `client_tools`). A launch refuses a client tool named like a registered one, so a
    name means one tool; were one added since, the registered tool keeps the name."""
    reg = registry(tools)
    for spec in profile.client_specs():
        if spec.name not in reg:
            reg.add(spec)
    return reg
