"""A call found by (run, call_id) on an index, in the journal and among an external run's
proposed calls: a decision API status read (its journal entry) and a proposal's
identical-call read (a call whose journal entry has the same fingerprint) walked every
entry of the run before (issue #48)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agents", "0038_demo_history_rules")]

    operations = [
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(fields=["run", "call_id"], name="toolcall_run_call"),
        ),
        migrations.AddIndex(
            model_name="clientcall",
            index=models.Index(fields=["run", "call_id"], name="clientcall_run_call"),
        ),
    ]
