"""The demo profile offers the help-desk tools (kb_search, http_get, send_email, refund).

Installations migrated before the demo tools existed have a demo profile offering every
registered tool; this narrows it to the demo's four. New installations get them from
0002 already (it reads agents.defaults), so this changes nothing there.
"""

from django.db import migrations

DEMO_TOOLS = ["kb_search", "http_get", "send_email", "refund"]


def forwards(apps, schema_editor):
    AgentProfile = apps.get_model("agents", "AgentProfile")
    AgentProfile.objects.filter(name="demo", tools__isnull=True).update(tools=DEMO_TOOLS)


class Migration(migrations.Migration):
    dependencies = [("agents", "0002_profiles_and_groups")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
