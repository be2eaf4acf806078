"""Bulk seeding for the page benchmarks: many runs cloned from one real run, in SQL.

A template run is driven through the real store (so every row has the shape the pages
expect); `clone_runs` then copies it N times with one INSERT ... SELECT per table,
server-side, so a million transitions take seconds instead of an hour of ORM saves.
Clones get their own ids, spread-out creation times and fresh idempotency keys (the
journal's key is unique), and a pending approval stays pending on every clone.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connection, models, transaction

from agents.models import Approval, Message, Run, ToolCall, Transition

# The child tables a clone may copy, each with the columns rewritten per clone
# (run_id is always the clone's; keys must stay unique).
CHILDREN: dict[str, type[models.Model]] = {
    "transitions": Transition,
    "messages": Message,
    "toolcalls": ToolCall,
    "approvals": Approval,
}
REKEYED = {"idempotency_key"}
SHIFTED = {"created_at", "decided_at", "finished_at"}


def _columns(model: type[models.Model]) -> list[str]:
    return [f.column for f in model._meta.concrete_fields if not f.primary_key]


def _quoted(names: list[str]) -> str:
    return ", ".join(connection.ops.quote_name(n) for n in names)


def clone_runs(
    template: Run, count: int, *, parts: tuple[str, ...] = tuple(CHILDREN), spacing_ms: int = 10
) -> dict[str, Any]:
    """Insert `count` copies of `template` with the chosen child rows; returns counts and seconds.

    Creation times step back `spacing_ms` per clone from the template's, so a list
    ordered by `created_at` sees distinct, realistic timestamps.
    """
    started = time.perf_counter()
    run_cols = _columns(Run)
    select = []
    for col in run_cols:
        if col == "created_at":
            select.append(f"t.created_at - (g * interval '{int(spacing_ms)} milliseconds')")
        else:
            select.append(f"t.{connection.ops.quote_name(col)}")
    counts: dict[str, int] = {}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("select coalesce(max(id), 0) from agents_run")
        watermark = int(cur.fetchone()[0])
        cur.execute(
            f"insert into agents_run ({_quoted(run_cols)}) "
            f"select {', '.join(select)} from agents_run t, generate_series(1, %s) g where t.id = %s order by g",
            [count, template.pk],
        )
        counts["runs"] = cur.rowcount
        for part in parts:
            model = CHILDREN[part]
            table = model._meta.db_table
            cols = _columns(model)
            values = []
            for col in cols:
                if col == "run_id":
                    values.append("r.id")
                elif col in SHIFTED:
                    # Child times move with the clone's run, so time-ordered lists see
                    # distinct, realistic timestamps (not 10,000 equal ones).
                    values.append(f"c.{col} + (r.created_at - %(created)s)")
                elif col in REKEYED:
                    # The clone's own key: unique per (clone, original key), same length.
                    values.append(f"encode(sha256(convert_to(r.id::text || ':' || c.{col}, 'UTF8')), 'hex')")
                else:
                    values.append(f"c.{connection.ops.quote_name(col)}")
            cur.execute(
                f"insert into {table} ({_quoted(cols)}) "
                f"select {', '.join(values)} from agents_run r join {table} c on c.run_id = %(template)s "
                f"where r.id > %(watermark)s order by r.id",
                {"template": template.pk, "watermark": watermark, "created": template.created_at},
            )
            counts[part] = cur.rowcount
    counts["seconds"] = time.perf_counter() - started  # type: ignore[assignment]
    return counts


def settle() -> None:
    """After a bulk load, the state a live database reaches by itself: the tables vacuumed
    and analyzed, as autovacuum leaves them (this machine's PostgreSQL runs without it),
    and the load's dirty pages written by a checkpoint, so that a checkpoint flushing
    gigabytes does not overlap the timings (it moved the pages' p50 by 1.6x between runs)."""
    with connection.cursor() as cur:
        for model in (Run, *CHILDREN.values()):
            cur.execute(f"vacuum (analyze) {model._meta.db_table}")
        cur.execute("checkpoint")
