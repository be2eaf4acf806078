"""Operators govern MCP tools in the admin (docs/mcp.md): the `operator` group gets
the permissions agents/defaults.py now names (view servers, view and change tools)."""

from django.db import migrations


def forwards(apps, schema_editor):
    from agents.defaults import ensure_in_migration

    ensure_in_migration(apps)


class Migration(migrations.Migration):
    dependencies = [("agents", "0013_digest_entries")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
