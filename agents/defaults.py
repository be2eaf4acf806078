"""The agent profiles and groups every installation has (the design's fixed names).

Used by the data migration (with historical models) and by tests that flush the
database (with the real ones), so both create exactly the same rows.
"""

from __future__ import annotations

from typing import Any

DIAGNOSTIC_TOOLS = ["echo", "fail", "sleep", "fetch_fixture", "ledger_write", "ledger_write_unsafe"]
DEMO_TOOLS = ["kb_search", "http_get", "send_email", "refund"]

PROFILES: dict[str, dict[str, Any]] = {
    "scripted": {
        "description": "Replays the decisions given with the run (tests, evals). All diagnostic tools.",
        "provider": "scripted",
        "model_name": "script",
        "tools": DIAGNOSTIC_TOOLS,
    },
    "demo": {
        "description": "A help-desk agent with an offline, deterministic planner: no API key needed.",
        "provider": "demo",
        "model_name": "demo-planner",
        "system_prompt": "You are a careful help-desk agent. Answer from the knowledge base.",
        "tools": DEMO_TOOLS,
    },
}

# group -> permissions (app_label.codename), as design.md's "Groups" describes them.
GROUPS: dict[str, list[str]] = {
    "reviewer": ["agents.view_run", "agents.view_approval", "agents.change_approval"],
    "operator": ["agents.view_run", "agents.view_approval", "agents.change_run"],
    "launcher": ["agents.add_run"],
}


def ensure(agent_profile: Any, group: Any, permission: Any) -> None:
    for name, fields in PROFILES.items():
        agent_profile.objects.get_or_create(name=name, defaults=fields)
    for name, perms in GROUPS.items():
        g, _ = group.objects.get_or_create(name=name)
        for dotted in perms:
            app_label, codename = dotted.split(".")
            g.permissions.add(permission.objects.get(content_type__app_label=app_label, codename=codename))
