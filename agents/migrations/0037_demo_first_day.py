"""The demo profile's runs get a deadline that fits a first day (24 hours, not the
default 15 minutes): their pending calls expired while a newcomer was still reading the
queue. Only a demo profile whose limits name no deadline of their own is changed; an
administrator's choice stays."""

from django.db import migrations

# Written out, not imported: this migration must mean the same thing whatever
# agents.defaults says later.
DEADLINE_SECONDS = 24 * 3600


def forwards(apps, schema_editor):
    AgentProfile = apps.get_model("agents", "AgentProfile")
    for profile in AgentProfile.objects.filter(name="demo"):
        limits = profile.limits if isinstance(profile.limits, dict) else None
        if limits is None or "deadline_seconds" in limits:
            continue
        profile.limits = {**limits, "deadline_seconds": DEADLINE_SECONDS}
        profile.save(update_fields=["limits"])


def backwards(apps, schema_editor):
    AgentProfile = apps.get_model("agents", "AgentProfile")
    for profile in AgentProfile.objects.filter(name="demo"):
        limits = profile.limits if isinstance(profile.limits, dict) else None
        if limits and limits.get("deadline_seconds") == DEADLINE_SECONDS:
            profile.limits = {k: v for k, v in limits.items() if k != "deadline_seconds"}
            profile.save(update_fields=["limits"])


class Migration(migrations.Migration):
    dependencies = [("agents", "0036_gateway_tasks")]

    operations = [migrations.RunPython(forwards, backwards)]
