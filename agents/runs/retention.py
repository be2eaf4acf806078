"""Retention: a finished run past its retention is purged into a tombstone.

A purge forgets the content (the task, the transcript, the answer, tool arguments and
results, the approval's shown arguments and untrusted text, reviewers' notes and
edited arguments, the run's outbox payloads) and keeps the decision record: the run
row's facts, every transition's skeleton, every approval's decision chain with the
sha256 of the exact call's canonical arguments, and every journal entry's tool, key,
status and hashes. `verify.verify_run` checks tombstones; docs/operations.md is the
operator's page.

Held runs (their own hold or their profile's) are never purged.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents.engine import fingerprints, states
from agents.models import (
    AgentProfile,
    Approval,
    ApprovalVote,
    Grant,
    Message,
    OutboxEvent,
    PurgeRecord,
    Run,
    ToolCall,
    Transition,
)
from agents.ops.metrics import REASON_PREFIXES

# What a transition's payload keeps: the keys /metrics folds (usage, call.tool,
# call_id, replayed, the reason's kind) and the decision record's plain words.
_KEEP_WORDS = frozenset({"call_id", "decision", "verdict", "status", "by", "kind", "risk", "tool", "key", "via"})
_KEEP_CALL = ("id", "tool", "key")
# The engine state's keys a tombstone keeps: counters, the launch snapshot, grants
# (tool and fingerprint, no arguments).
_KEEP_ENGINE = (
    "run_id", "state", "steps", "model_calls", "cost_micros", "cost_unknown", "tokens", "tainted", "deadline",
    "approver", "limits", "tools", "denied_tools", "always_ask_tools", "prices", "policy", "grants",
)  # fmt: skip
_KEEP_TAINT = ("call_id", "tool", "key", "step")


@dataclass
class PurgeReport:
    runs: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    run_ids: list[int] = field(default_factory=list)
    record: PurgeRecord | None = None

    def add(self, other: PurgeReport) -> None:
        self.runs += other.runs
        self.bytes += other.bytes
        self.run_ids += other.run_ids
        for k, v in other.rows.items():
            self.rows[k] = self.rows.get(k, 0) + v


def retention_of(profile_days: int | None) -> int | None:
    """A profile's retention in days: its own, else the deployment's, else None (keep)."""
    return profile_days if profile_days is not None else settings.AIRLOCK_RETENTION_DAYS


def retention_set() -> bool:
    """Whether the deployment or any profile has a retention at all."""
    return (
        settings.AIRLOCK_RETENTION_DAYS is not None
        or AgentProfile.objects.filter(retention_days__isnull=False).exists()
    )


def _finished_before(cutoff: dt.datetime) -> Q:
    return Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, updated_at__lt=cutoff)


def purgeable() -> models.QuerySet[Run]:
    """Runs a purge may touch at all: finished, not yet purged, not held."""
    return Run.objects.filter(
        state__in=states.TERMINAL, purged_at__isnull=True, hold_reason="", profile__hold_reason=""
    )


def due(
    *, now: dt.datetime | None = None, older_than_days: int | None = None, agent: str | None = None
) -> dict[int, int]:
    """{run id: the retention in days it is purged under} of the runs due now: older than
    `older_than_days` if given, else than their profile's retention."""
    now = now or timezone.now()
    runs = purgeable()
    if agent:
        runs = runs.filter(profile__name=agent)
    if older_than_days is not None:
        ids = runs.filter(_finished_before(now - dt.timedelta(days=older_than_days)))
        return {pk: older_than_days for pk in ids.order_by("pk").values_list("pk", flat=True)}
    found: dict[int, int] = {}
    for profile_id, own in AgentProfile.objects.values_list("pk", "retention_days"):
        days = retention_of(own)
        if days is None:
            continue  # no retention: kept forever, as before retention existed
        ids = runs.filter(profile_id=profile_id).filter(_finished_before(now - dt.timedelta(days=days)))
        found.update({pk: days for pk in ids.order_by("pk").values_list("pk", flat=True)})
    return dict(sorted(found.items()))


class _Stored(models.Func):  # type: ignore[misc]
    """A column's stored bytes, 0 for NULL. On PostgreSQL pg_column_size reads only the
    value's header: no detoasting, no rendering of jsonb to text, which cost the server
    as much CPU per batch as all of the batch's writes (CPU the live runs share on a
    small machine). Elsewhere (SQLite), the length of its text."""

    function = "pg_column_size"
    output_field = models.BigIntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="length(CAST(%(expressions)s AS TEXT))", **extra)


def measure(ids: list[int]) -> tuple[dict[str, int], int]:
    """(rows a purge of `ids` removes or empties, by table; the content bytes it
    forgets, about: the stored sizes of the columns it empties). One query per table."""
    tables = {
        "runs": (Run.objects.filter(pk__in=ids), ("task", "answer", "script")),
        "messages": (Message.objects.filter(run_id__in=ids), ("content", "tool_calls")),
        "transitions": (Transition.objects.filter(run_id__in=ids), ("payload",)),
        "tool_calls": (ToolCall.objects.filter(run_id__in=ids), ("args", "result")),
        "approvals": (Approval.objects.filter(run_id__in=ids), ("args", "edited_args", "note", "taint_source")),
        "votes": (ApprovalVote.objects.filter(approval__run_id__in=ids), ("note", "args")),
    }
    rows: dict[str, int] = {}
    size = 0
    for name, (qs, columns) in tables.items():
        found = qs.aggregate(n=Count("pk"), **{c: Coalesce(Sum(Coalesce(_Stored(c), 0)), 0) for c in columns})
        if name != "runs":  # a run is not removed: it stays, as the tombstone
            rows[name] = found["n"]
        size += sum(found[c] for c in columns)
    return rows, size


def purge(
    *,
    actor: str,
    user: Any = None,
    older_than_days: int | None = None,
    agent: str | None = None,
    only: Iterable[int] | None = None,
    dry_run: bool = False,
    exported_to: str = "",
    now: dt.datetime | None = None,
    batch: int | None = None,
    pause_ms: int | None = None,
) -> PurgeReport:
    """Purge the runs due now (or those of `only` still due), in batches.

    1. Pick the runs due (`due`): finished, past their retention, not held.
    With no retention anywhere and no `older_than_days`, nothing is due and nothing is
    written (the daily job of a deployment that keeps everything).
    2. A dry run measures them and stops: nothing is written, not even a record.
    3. Otherwise write the audit record first, then purge AIRLOCK_PURGE_BATCH runs per
       transaction (`_purge_batch`), updating the record's counts after each: a purge
       never holds locks or grows the WAL for longer than one batch, and one that dies
       half-way has a record of what it did. Between two batches it waits
       AIRLOCK_PURGE_PAUSE_MS (`pause_ms`), holding nothing, so live runs' commits get
       the disk and the CPU.
    """
    now = now or timezone.now()
    if older_than_days is None and not retention_set():
        return PurgeReport()  # nothing has a retention: not a purge, and no record of one
    picked = due(now=now, older_than_days=older_than_days, agent=agent)
    if only is not None:
        wanted = set(only)
        picked = {pk: days for pk, days in picked.items() if pk in wanted}
    ids = list(picked)
    report = PurgeReport()
    size = batch or settings.AIRLOCK_PURGE_BATCH
    if dry_run:
        for i in range(0, len(ids), size):
            rows, nbytes = measure(ids[i : i + size])
            report.add(PurgeReport(runs=len(ids[i : i + size]), rows=rows, bytes=nbytes, run_ids=ids[i : i + size]))
        return report
    record = PurgeRecord.objects.create(
        started_at=timezone.now(), actor=actor, by=user, older_than_days=older_than_days,
        cutoff=now - dt.timedelta(days=older_than_days) if older_than_days is not None else None,
        agent=agent or "", exported_to=exported_to,
    )  # fmt: skip
    report.record = record
    pause = (settings.AIRLOCK_PURGE_PAUSE_MS if pause_ms is None else pause_ms) / 1000
    for i in range(0, len(ids), size):
        if i and pause:
            time.sleep(pause)  # outside any transaction of ours: no lock is held meanwhile
        report.add(_purge_batch({pk: picked[pk] for pk in ids[i : i + size]}, now))
        record.runs, record.rows, record.bytes = report.runs, report.rows, report.bytes
        record.save(update_fields=["runs", "rows", "bytes"])
    record.finished_at = timezone.now()
    record.save(update_fields=["finished_at"])
    return report


def _purge_batch(picked: dict[int, int], now: dt.datetime) -> PurgeReport:
    """Purge one batch in one transaction.

    The run rows are locked first and filtered again: a hold placed since `due` read
    them (a conditional update of the same row) wins, and that run is left as it is.
    Only finished runs are touched, so no worker's commit waits on these locks.
    """
    with transaction.atomic():
        locked = purgeable().select_for_update(of=("self",)).filter(pk__in=list(picked))
        runs = list(locked.order_by("pk").only("pk", "error", "engine"))
        ids = [r.pk for r in runs]
        if not ids:
            return PurgeReport()
        rows, nbytes = measure(ids)
        for run in runs:
            run.error = error_kind(run.error)
            run.task, run.answer, run.script, run.engine = "", None, None, _engine_skeleton(run.engine, run.error)
            run.purged_at, run.purge_retention_days = now, picked[run.pk]
        # Not save(): updated_at keeps the time the run last moved.
        _rewrite(
            Run, _values(runs, ["task", "answer", "script", "error", "engine", "purged_at", "purge_retention_days"])
        )
        Message.objects.filter(run_id__in=ids).delete()
        # Plain values, not model instances, for the two tables with most rows: building
        # a model per row was a third of a batch's time in Python.
        emptied = {}
        for pk, payload in Transition.objects.filter(run_id__in=ids).values_list("pk", "payload").iterator(2000):
            kept = skeleton(payload)
            if kept != payload:  # already a skeleton: rewriting it would only add WAL
                emptied[pk] = {"payload": kept}
        # _rewrite bypasses Transition.save's immutability guard on purpose: the
        # skeleton is the one rewrite a transition ever gets.
        _rewrite(Transition, emptied)
        hashed = {}
        for pk, args, result in (
            ToolCall.objects.filter(run_id__in=ids).values_list("pk", "args", "result").iterator(2000)
        ):
            result_sha256 = (
                "" if result is None else hashlib.sha256(fingerprints.canonical_json(result).encode()).hexdigest()
            )
            hashed[pk] = {
                "args": None,
                "result": None,
                "args_sha256": fingerprints.args_hash(args),
                "result_sha256": result_sha256,
            }
        _rewrite(ToolCall, hashed)
        approvals = list(
            Approval.objects.filter(run_id__in=ids).only(
                "pk", "args", "edited_args", "taint_source", "args_sha256", "reason", "rule", "history"
            )
        )
        for a in approvals:
            a.args_sha256 = a.args_hash  # the hash of the call as it stood (the edit, if any)
            a.args = a.edited_args = None
            if a.history is not None:
                # A history rule's figures name the call's `same` values ("with customer
                # jane@..."): the rule's own reason and the figures without them remain.
                a.reason = (a.rule or {}).get("reason") or a.reason.split(": ")[0]
                a.history = {k: v for k, v in a.history.items() if k not in ("same", "text")}
            a.taint_source = (
                {k: v for k, v in a.taint_source.items() if k in _KEEP_TAINT}
                if isinstance(a.taint_source, dict)
                else None
            )
            a.note = ""
        _rewrite(
            Approval,
            _values(approvals, ["args", "edited_args", "taint_source", "note", "args_sha256", "reason", "history"]),
        )
        ApprovalVote.objects.filter(approval__run_id__in=ids).update(note="", args=None)
        grants = list(Grant.objects.filter(run_id__in=ids).exclude(args=None).only("pk", "args"))
        for g in grants:
            g.args = {"sha256": fingerprints.args_hash(g.args)}  # still one exact call, by hash
        _rewrite(Grant, _values(grants, ["args"]))
        OutboxEvent.objects.filter(run_id__in=ids).update(data=None)
    return PurgeReport(runs=len(ids), rows=rows, bytes=nbytes, run_ids=ids)


def _values(objs: list[Any], fields: list[str]) -> dict[int, dict[str, Any]]:
    return {o.pk: {f: getattr(o, f) for f in fields} for o in objs}


def _rewrite(model: type[models.Model], rows: dict[int, dict[str, Any]]) -> None:
    """Write rows back by primary key: {pk: {field: value}}, the same fields in every
    row. On PostgreSQL one UPDATE ... FROM jsonb_to_recordset per call: bulk_update's
    CASE per row spent 80% of a purge compiling SQL. Elsewhere (SQLite), bulk_update."""
    if not rows:
        return
    fields = list(next(iter(rows.values())))
    if connection.vendor != "postgresql":
        model.objects.bulk_update([model(pk=pk, **values) for pk, values in rows.items()], fields, batch_size=500)
        return
    qn = connection.ops.quote_name
    columns = [model._meta.get_field(f) for f in fields]
    spec = ", ".join(f"{qn(c.column)} {c.db_type(connection)}" for c in columns)
    sets = ", ".join(f"{qn(c.column)} = v.{qn(c.column)}" for c in columns)
    data = [{"id": pk, **{c.column: values[c.name] for c in columns}} for pk, values in rows.items()]
    table = qn(model._meta.db_table)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {table} SET {sets} FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, {spec}) "  # noqa: S608 (names from the model)
            f"WHERE {table}.id = v.id",
            [json.dumps(data, cls=DjangoJSONEncoder)],
        )


def error_kind(error: str | None) -> str | None:
    """What a tombstone keeps of a run's error: the engine's own wording of its kind
    (the prefix /metrics reads), never the free text after it."""
    if error is None:
        return None
    for prefix, _ in REASON_PREFIXES:
        if error.startswith(prefix):
            return prefix
    return ""


def skeleton(payload: Any) -> dict[str, Any]:
    """A transition's payload as a tombstone keeps it: no patch, no text."""
    if not isinstance(payload, dict):
        return {}
    kept: dict[str, Any] = {}
    for key, value in payload.items():
        if key == "usage" and isinstance(value, dict):
            kept[key] = {k: v for k, v in value.items() if isinstance(v, int | float)}
        elif key == "call" and isinstance(value, dict):
            kept[key] = {k: value[k] for k in _KEEP_CALL if k in value}
        elif key == "reason" and isinstance(value, str):
            kept[key] = error_kind(value)
        elif key == "rule" and (value is None or isinstance(value, dict)):
            kept[key] = value  # the operator's rule, not the run's content
        elif isinstance(value, bool | int | float) or value is None:
            kept[key] = value
        elif key in _KEEP_WORDS and isinstance(value, str):
            kept[key] = value
    return kept


def _engine_skeleton(engine: Any, error: str | None) -> dict[str, Any]:
    engine = engine if isinstance(engine, dict) else {}
    kept = {k: engine[k] for k in _KEEP_ENGINE if k in engine}
    kept["error"] = error
    kept["answer"] = None
    return kept
