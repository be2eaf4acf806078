"""A run's engine state is compressed with lz4, not pglz (PostgreSQL only).

Every transition rewrites the run's row with its engine state. Under a few rules the
policy alone makes that state about 2 kB, past the 2 kB at which PostgreSQL compresses
a row's widest value, so every commit compressed it and every read decompressed it:
under the history bench's five rules a proposal's commit statement ran 31-34 us longer
than a rule-less one's with pglz, 16-17 us with lz4 (statement log, 420 commits a side).
Storing such rows uncompressed (`toast_tuple_target = 8160`) saved a little more, but
kept a run's large columns that no transition changes (a scripted run's script) in the
row, so every transition copied them: twice the disk and 9% more WAL per tool call in
`bench/run.py`'s engine runs. A server built without lz4 keeps pglz."""

from django.db import migrations

LZ4 = """
DO $$
BEGIN
    EXECUTE 'ALTER TABLE agents_run ALTER COLUMN engine SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'agents_run.engine stays compressed with pglz: %', SQLERRM;
END
$$
"""


def lz4(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(LZ4, params=None)  # no placeholders: RAISE has its own %


def pglz(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE agents_run ALTER COLUMN engine SET COMPRESSION default")


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0038_demo_history_rules"),
    ]

    operations = [
        migrations.RunPython(lz4, pglz),
    ]
