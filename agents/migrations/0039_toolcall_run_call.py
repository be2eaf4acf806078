"""A call's journal entry found by (run, call_id) on an index: a decision API status
read (and the read ahead of it, issue #48) walked every journal entry of the run before."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agents", "0038_demo_history_rules")]

    operations = [
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(fields=["run", "call_id"], name="toolcall_run_call"),
        ),
    ]
