"""History rules (issue 49): the approval keeps the figures a history rule asked with,
and the journal is indexed for the history queries (agents/runs/history.py)."""

from django.db import migrations, models

# PostgreSQL only: `args @> {"order_id": "1042"}` finds the calls with one `same` value
# among a scope's thousands. jsonb_path_ops: smaller and faster for containment, the only
# operator the history queries use on it. fastupdate off: each new call goes into the
# index as it is written, so a read never scans a list of pending entries (with it on,
# 100,000 fresh calls made one lookup 2 ms instead of 0.05).
GIN = (
    "CREATE INDEX IF NOT EXISTS toolcall_args_gin ON agents_toolcall USING gin (args jsonb_path_ops)"
    " WITH (fastupdate = off)"
)
GIN_APPROVAL = (
    "CREATE INDEX IF NOT EXISTS approval_pending_args_gin ON agents_approval USING gin (args jsonb_path_ops)"
    " WITH (fastupdate = off) WHERE status = 'pending'"
)


def gin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(GIN)
        schema_editor.execute(GIN_APPROVAL)


def no_gin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS toolcall_args_gin")
        schema_editor.execute("DROP INDEX IF EXISTS approval_pending_args_gin")


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0031_slack_linked_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="history",
            field=models.JSONField(
                blank=True, help_text="the deciding history rule's figures (engine.history.Reading), or null", null=True
            ),
        ),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(fields=["tool", "created_at"], name="toolcall_tool_created"),
        ),
        migrations.RunPython(gin, no_gin),
    ]
