"""The demo profile carries the four example rules of "rules that remember" (issue 49):
a runaway client (200 calls an hour), a third refund of one order in a day, over 500
EUR to one customer in a week, an email after a customer export; and the demo's
`export_customers` tool that the last one watches for. Only a demo profile whose rules
and tools are still what 0002 seeded is changed; an administrator's own stay."""

from django.db import migrations

# Written out, not imported: this migration must mean the same thing whatever
# agents.defaults says later.
TOOLS_BEFORE = ["kb_search", "http_get", "send_email", "refund"]
TOOLS_AFTER = [*TOOLS_BEFORE, "export_customers"]
RULES_BEFORE = [
    {"tool": "refund", "when": {"arg": "amount", "op": "lt", "value": 20}, "then": "allow",
     "reason": "refunds under 20 need no human"},
    {"tool": "refund", "then": "ask", "reason": "refunds of 20 or more need a human"},
]
RULES_AFTER = [
    {"tool": "*", "then": "deny", "reason": "runaway client",
     "history": {"within": "1h", "scope": "caller", "calls_over": 200}},
    {"tool": "refund", "then": "ask", "reason": "a third refund of one order in a day",
     "history": {"within": "24h", "scope": "profile", "same": ["order_id"], "calls_over": 2}},
    {"tool": "refund", "when": {"all": [{"arg": "customer", "op": "exists"}, {"arg": "amount", "op": "exists"}]},
     "then": "ask", "reason": "over 500 EUR to one customer this week",
     "history": {"within": "7d", "scope": "project", "same": ["customer"], "sum_over": {"amount": 500}}},
    *RULES_BEFORE,
    {"tool": "send_email", "then": "ask", "reason": "writes after reading a customer export",
     "history": {"scope": "run", "after": ["export_customers", "crm__search"]}},
]


def _change(apps, tools: tuple[list, list], rules: tuple[list, list]) -> None:
    AgentProfile = apps.get_model("agents", "AgentProfile")
    for profile in AgentProfile.objects.filter(name="demo"):
        changed = []
        if profile.tools == tools[0]:
            profile.tools = tools[1]
            changed.append("tools")
        if profile.rules == rules[0]:
            profile.rules = rules[1]
            changed.append("rules")
        if changed:
            profile.save(update_fields=changed)


def forwards(apps, schema_editor):
    _change(apps, (TOOLS_BEFORE, TOOLS_AFTER), (RULES_BEFORE, RULES_AFTER))


def backwards(apps, schema_editor):
    _change(apps, (TOOLS_AFTER, TOOLS_BEFORE), (RULES_AFTER, RULES_BEFORE))


class Migration(migrations.Migration):
    dependencies = [("agents", "0037_demo_first_day")]

    operations = [migrations.RunPython(forwards, backwards)]
