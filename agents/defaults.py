"""The agent profiles and groups every installation has (the design's fixed names).

Used by the data migration (with historical models) and by tests that flush the
database (with the real ones), so both create exactly the same rows.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.management import create_permissions

DIAGNOSTIC_TOOLS = ["echo", "fail", "sleep", "fetch_fixture", "ledger_write", "ledger_write_unsafe"]
DEMO_TOOLS = ["kb_search", "http_get", "send_email", "refund", "export_customers"]
# The demo's rules (docs/policy.md), first match wins: the four history rules
# ("rules that remember") first, so they see the small refunds rule 4 would let through;
# then small refunds go through and others ask. A history rule that does not hold
# decides nothing: the call goes on to the next rule. 0038 brings installations seeded
# before to these rules and tools.
DEMO_RULES: list[dict[str, Any]] = [
    {"tool": "*", "then": "deny", "reason": "runaway client",
     "history": {"within": "1h", "scope": "caller", "calls_over": 200}},
    {"tool": "refund", "then": "ask", "reason": "a third refund of one order in a day",
     "history": {"within": "24h", "scope": "profile", "same": ["order_id"], "calls_over": 2}},
    # Only refunds that name their customer and an amount (the demo planner names both;
    # one without an amount is the order's whole amount, which rule 5 asks about).
    {"tool": "refund", "when": {"all": [{"arg": "customer", "op": "exists"}, {"arg": "amount", "op": "exists"}]},
     "then": "ask", "reason": "over 500 EUR to one customer this week",
     "history": {"within": "7d", "scope": "project", "same": ["customer"], "sum_over": {"amount": 500}}},
    {"tool": "refund", "when": {"arg": "amount", "op": "lt", "value": 20}, "then": "allow",
     "reason": "refunds under 20 need no human"},
    {"tool": "refund", "then": "ask", "reason": "refunds of 20 or more need a human"},
    {"tool": "send_email", "then": "ask", "reason": "writes after reading a customer export",
     "history": {"scope": "run", "after": ["export_customers", "crm__search"]}},
]

# A first day: a newcomer reads the queue for longer than the default 15 minutes, and a
# demo call must still be waiting when they decide (README). 0037 sets it on
# installations seeded before.
DEMO_LIMITS: dict[str, Any] = {"deadline_seconds": 24 * 3600}

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
        "limits": DEMO_LIMITS,
        "separate_duties": True,
    },
}

# group -> permissions (app_label.codename), as design.md's "Groups" describes them.
# Operators also govern MCP tools in the admin (docs/mcp.md): they see the servers and
# change a tool (accept its changed definition, set an override); changing a server is
# choosing what the workers run, so that stays with superusers.
GROUPS: dict[str, list[str]] = {
    "reviewer": ["agents.view_run", "agents.view_approval", "agents.change_approval"],
    "operator": ["agents.view_run", "agents.view_approval", "agents.change_run",
                 "agents.view_mcpserver", "agents.view_mcptool", "agents.change_mcptool"],
    "launcher": ["agents.add_run"],
}


def profile_fields(agent_profile: Any, name: str) -> dict[str, Any]:
    """The profile's default fields that this (possibly historical) model has: 0002
    creates the profiles before later migrations add fields, which then fill them."""
    known = {f.name for f in agent_profile._meta.get_fields()}
    return {k: v for k, v in PROFILES[name].items() if k in known}


def ensure(agent_profile: Any, group: Any, permission: Any) -> None:
    """Create the profiles and groups and grant the groups' permissions (idempotent).

    A permission whose model does not exist yet in these (historical) models is left for
    the migration that comes after the model: 0002 runs before 0009 creates the MCP
    models, 0014 grants their permissions. A permission of a model that exists must be
    there: a typo fails loudly.
    """
    for name in PROFILES:
        agent_profile.objects.get_or_create(name=name, defaults=profile_fields(agent_profile, name))
    for name, perms in GROUPS.items():
        g, _ = group.objects.get_or_create(name=name)
        for dotted in perms:
            app_label, codename = dotted.split(".")
            found = permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if found is None and not _model_exists(group, app_label, codename):
                continue
            if found is None:
                raise LookupError(f"permission {dotted} of group {name} does not exist")
            g.permissions.add(found)


def _model_exists(group: Any, app_label: str, codename: str) -> bool:
    model_name = codename.split("_", 1)[1]  # "change_mcptool" -> "mcptool"
    try:
        group._meta.apps.get_model(app_label, model_name)
    except LookupError:
        return False
    return True


def ensure_in_migration(apps: Any) -> None:
    """`ensure()` from a data migration: permissions are normally created after
    `migrate`, and the groups need them now."""
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    ensure(apps.get_model("agents", "AgentProfile"), apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))
