# Escalation (#28): the backup group an approval was escalated to, as it was then, and
# the new event `approval.escalated` in the webhooks' list of event types, and the help
# texts of who reviews a profile (help text only).
# `escalated_to` has a database default: the one-statement commit (agents/runs/statement.py)
# inserts approvals by raw SQL that does not name it.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0024_claims"),
    ]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="escalated_to",
            field=models.CharField(blank=True, db_default="", default="", max_length=150),
        ),
        migrations.AlterField(
            model_name="webhook",
            name="events",
            field=models.JSONField(
                default=list,
                help_text="event types, of approval.pending, approval.decided, approval.expired, approval.expiring, approval.escalated, run.done, run.failed, run.cancelled",
            ),
        ),
        migrations.AlterField(
            model_name="agentprofile",
            name="backup_group",
            field=models.CharField(
                blank=True,
                default="",
                help_text="the Django group that may also see and decide a call once it is escalated, and is told then",
                max_length=150,
            ),
        ),
        migrations.AlterField(
            model_name="agentprofile",
            name="escalate_after_seconds",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="escalate a call still pending this many seconds after it was asked to the backup group (empty: never)",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="agentprofile",
            name="reviewer_group",
            field=models.CharField(
                blank=True,
                default="",
                help_text="the Django group whose members see and decide this profile's calls (empty: the reviewer group); superusers always may",
                max_length=150,
            ),
        ),
    ]
