"""A run's row is kept whole in its page up to a page's size (PostgreSQL only).

Every transition rewrites the run's row with its engine state, whose policy alone is a
kilobyte or more under a few rules. By default PostgreSQL compresses a row's widest
value once the row passes 2 kB (`toast_tuple_target`), on every update, and every read
decompresses it again: under the history bench's five rules a proposal's commit spent
about 0.03 ms of the server's time compressing an engine state of 2 kB into 1.1 kB.
Up to 8,160 bytes (the most a page holds) the row is now stored as it is; a larger one
is still compressed and moved out as before."""

from django.db import migrations


def inline(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE agents_run SET (toast_tuple_target = 8160)")


def default(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE agents_run RESET (toast_tuple_target)")


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0038_demo_history_rules"),
    ]

    operations = [
        migrations.RunPython(inline, default),
    ]
