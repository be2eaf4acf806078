"""The agent profiles and groups every installation has (the design's fixed names).

Used by the data migration (with historical models) and by tests that flush the
database (with the real ones), so both create exactly the same rows.
"""

from __future__ import annotations

from typing import Any

DIAGNOSTIC_TOOLS = ["echo", "fail", "sleep", "fetch_fixture", "ledger_write", "ledger_write_unsafe"]
DEMO_TOOLS = ["kb_search", "http_get", "send_email", "refund"]
# The demo's argument rules (docs/policy.md): small refunds go through, others ask.
DEMO_RULES: list[dict[str, Any]] = [
    {"tool": "refund", "when": {"arg": "amount", "op": "lt", "value": 20}, "then": "allow",
     "reason": "refunds under 20 need no human"},
    {"tool": "refund", "then": "ask", "reason": "refunds of 20 or more need a human"},
]

PROFILES: dict[str, dict[str, Any]] = {
    "scripted": {
        "description": "Replays the decisions given with the run (tests, evals). All diagnostic tools.",
        "provider": "scripted",
        "model_name": "script",
        "tools": DIAGNOSTIC_TOOLS,
        "separate_duties": False,
    },
    "demo": {
        "description": "A help-desk agent with an offline, deterministic planner: no API key needed.",
        "provider": "demo",
        "model_name": "demo-planner",
        "system_prompt": "You are a careful help-desk agent. Answer from the knowledge base.",
        "tools": DEMO_TOOLS,
        "rules": DEMO_RULES,
        "separate_duties": True,
    },
}

# group -> permissions (app_label.codename), as design.md's "Groups" describes them.
GROUPS: dict[str, list[str]] = {
    "reviewer": ["agents.view_run", "agents.view_approval", "agents.change_approval"],
    "operator": ["agents.view_run", "agents.view_approval", "agents.change_run"],
    "launcher": ["agents.add_run"],
}


def profile_fields(agent_profile: Any, name: str) -> dict[str, Any]:
    """The profile's default fields that this (possibly historical) model has: 0002
    creates the profiles before later migrations add fields, which then fill them."""
    known = {f.name for f in agent_profile._meta.get_fields()}
    return {k: v for k, v in PROFILES[name].items() if k in known}


def ensure(agent_profile: Any, group: Any, permission: Any) -> None:
    for name in PROFILES:
        agent_profile.objects.get_or_create(name=name, defaults=profile_fields(agent_profile, name))
    for name, perms in GROUPS.items():
        g, _ = group.objects.get_or_create(name=name)
        for dotted in perms:
            app_label, codename = dotted.split(".")
            g.permissions.add(permission.objects.get(content_type__app_label=app_label, codename=codename))
