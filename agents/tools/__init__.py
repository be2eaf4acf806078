"""Built-in tools, one module each, and the tools of registered MCP servers (`mcp/`);
`registry()` returns the ones this deployment offers."""

from __future__ import annotations

import importlib

from django.conf import settings

from agents.engine.registry import Registry


def registry() -> Registry:
    from . import demo, diagnostic

    reg = Registry()
    for spec in demo.TOOLS:
        reg.add(spec)
    if settings.AIRLOCK_ALLOW_SCRIPTED:
        for spec in diagnostic.TOOLS:
            reg.add(spec)
    for name in settings.AIRLOCK_EXTRA_TOOLS if settings.AIRLOCK_ALLOW_SCRIPTED else []:
        for spec in importlib.import_module(name).TOOLS:
            reg.add(spec)
    from . import mcp

    for spec in mcp.specs():
        # `NAME__tool` cannot collide with a built-in name, which has no `__`.
        reg.add(spec)
    return reg
