"""Retention (issue 31): a purge forgets a finished run's content and keeps its decision
record; held runs are kept; an export is checked against its manifest."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_hold, run_release
from agents.actions.tokens import token_create
from agents.engine import fingerprints
from agents.models import AgentProfile, Approval, Message, MetricTally, PurgeRecord, Run, ToolCall, Transition
from agents.ops import metrics
from agents.runs import driver, retention
from agents.runs.export import check_archive
from agents.runs.verify import verify_run
from reviews import stats
from tests.helpers import Api, call, client_for, csrf_post, final, requires_postgres, wait_for

pytestmark = pytest.mark.django_db

SECRET = "PLANTED-7f3a-customer-jane@example.org"
USAGE = {"input_tokens": 120, "output_tokens": 30}


@pytest.fixture
def api(lena, otto) -> Any:
    """api("otto") -> a JSON client carrying a fresh token of that persona's."""
    people = {u.username: u for u in (lena, otto)}
    return lambda name: Api(token_create(user=people[name])[1])


def decided_run(launch: Any, drive: Any, reviewer: Any, *, task: str = f"help {SECRET}") -> Run:
    """A finished run with the secret everywhere content goes: the task, a fetched page,
    the arguments of an approved write (edited by the reviewer), the reviewer's note,
    the answer."""
    script = [
        {**call("fetch_fixture", text=f"page about {SECRET}"), "usage": USAGE},
        {**call("ledger_write", entry=f"refund {SECRET}"), "usage": USAGE},
        {**final(f"answered {SECRET}"), "usage": USAGE},
    ]
    run = drive(launch(script, task=task))
    assert run.state == "awaiting_approval", (run.state, run.error)
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(
        approval_id=approval.pk, user=reviewer, decision="approve", note=f"ok for {SECRET}",
        args={"entry": f"edited {SECRET}"},
    )  # fmt: skip
    run = drive(run)
    assert run.state == "done", (run.state, run.error)
    return run


def tables_holding(text: str) -> list[str]:
    """Every table with a row whose text holds `text`. The ledger is left out: it stands
    for the outside world a tool wrote to, which no purge of ours may reach into."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            if table == "agents_ledgerentry":
                continue
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608 (table names from the schema)
            if any(text in str(row) for row in cursor.fetchall()):
                found.append(table)
    return sorted(found)


def tallies() -> dict[tuple[str, str, int], tuple[int, int]]:
    return {(t.name, t.labels, t.bucket): (t.count, t.total) for t in MetricTally.objects.exclude(name=metrics.MARK)}


def purge_cmd(*args: str) -> str:
    out = io.StringIO()
    call_command("purge_runs", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_purge_forgets_the_content_and_keeps_who_decided_what_under_which_rule(launch, drive, rita, settings) -> None:
    settings.AIRLOCK_METRICS_FOLD_LAG_SECONDS = 0
    run = decided_run(launch, drive, rita)
    approval = Approval.objects.get(run=run)
    decided_hash = approval.args_hash  # the reviewer's edit, as it ran
    journal = ToolCall.objects.get(idempotency_key=approval.idempotency_key)
    before = {
        "transitions": list(run.transitions.order_by("seq").values_list("seq", "from_state", "to_state", "kind", "actor", "cost_micros", "tokens", "duration_ms", "created_at")),
        "run": Run.objects.values("state", "steps", "cost_micros", "tokens", "created_by", "created_at", "finished_at").get(pk=run.pk),
    }  # fmt: skip
    metrics.fold()
    folded = tallies()
    assert tables_holding(SECRET), "the scenario must plant the secret somewhere"

    out = purge_cmd("--older-than", "0")

    assert "purged 1 run(s)" in out
    assert tables_holding(SECRET) == []
    run.refresh_from_db()
    assert run.purged_at is not None and run.purge_retention_days == 0
    assert run.task == "" and run.answer is None and not Message.objects.filter(run=run).exists()
    # The facts and the skeleton are as they were.
    assert Run.objects.values(*before["run"]).get(pk=run.pk) == before["run"]
    assert list(run.transitions.order_by("seq").values_list(
        "seq", "from_state", "to_state", "kind", "actor", "cost_micros", "tokens", "duration_ms", "created_at"
    )) == before["transitions"]  # fmt: skip
    # The decision chain, bound to the exact arguments by hash, and the journal's.
    approval.refresh_from_db()
    assert (approval.status, approval.decision, approval.decided_by, approval.args) == (
        "approved",
        "approve",
        rita,
        None,
    )
    assert approval.args_sha256 == decided_hash == fingerprints.args_hash({"entry": f"edited {SECRET}"})
    assert approval.args_hash == decided_hash
    assert [v.by_name for v in approval.votes.all()] == ["rita"]
    journal.refresh_from_db()
    assert (journal.tool, journal.status, journal.args, journal.result) == ("ledger_write", "succeeded", None, None)
    assert journal.args_sha256 == decided_hash and journal.result_sha256
    assert verify_run(run) == []
    # Folding the purged log again gives the very same metrics.
    MetricTally.objects.all().delete()
    metrics.fold()
    assert tallies() == folded
    record = PurgeRecord.objects.get()
    assert (record.runs, record.actor, record.rows["messages"]) == (
        1,
        "manage.py purge_runs",
        before["run"]["steps"] + 1,
    )
    assert record.bytes > 0 and record.finished_at is not None


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_the_api_and_the_run_page_say_what_was_purged_and_what_remains(launch, drive, rita, otto, api) -> None:
    run = decided_run(launch, drive, rita)
    purge_cmd("--older-than", "0")
    data = api("otto").get(f"/api/runs/{run.pk}").data
    assert data["purged_at"] is not None and data["hold"] is None and data["task"] == ""
    page = client_for(otto).get(f"/runs/{run.pk}/").content.decode()
    assert "under the 0-day retention" in page and "Content purged" in page
    assert Approval.objects.get(run=run).args_sha256 in page
    assert SECRET not in page
    # The other pages that show a run's content answer too, with nothing of it left.
    approval = Approval.objects.get(run=run)
    for url in (f"/reviews/{approval.pk}/", f"/runs/{run.pk}/export/", f"/api/runs/{run.pk}/transitions"):
        response = client_for(rita).get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode(), url


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_verify_runs_catches_a_tampered_tombstone(launch, drive, rita) -> None:
    run = decided_run(launch, drive, rita)
    purge_cmd("--older-than", "0")
    run.refresh_from_db()
    assert verify_run(run) == []
    first = run.transitions.order_by("seq").first()
    Transition.objects.filter(pk=first.pk).update(tokens=first.tokens + 1)
    assert any("tokens sum" in p for p in verify_run(run))
    Transition.objects.filter(pk=first.pk).update(tokens=first.tokens)
    ToolCall.objects.filter(run=run, tool="ledger_write").update(args_sha256="0" * 64)
    assert any("the journal ran" in p for p in verify_run(run))
    with pytest.raises(SystemExit):
        call_command("verify_runs", str(run.pk), stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_held_runs_and_runs_of_a_held_profile_are_never_purged(launch, drive, rita, otto) -> None:
    held = decided_run(launch, drive, rita)
    gone = drive(launch([final("bye")]))
    run_hold(run_id=held.pk, user=otto, reason="litigation 2026-114")
    assert "purged 1 run(s)" in purge_cmd("--older-than", "0")
    held.refresh_from_db()
    gone.refresh_from_db()
    assert held.purged_at is None and SECRET in held.task and gone.purged_at is not None

    AgentProfile.objects.filter(name="scripted").update(hold_reason="regulator's audit")
    run_release(run_id=held.pk, user=otto)
    assert "purged 0 run(s)" in purge_cmd("--older-than", "0")
    held.refresh_from_db()
    assert held.purged_at is None and held.to_dict()["hold"]["scope"] == "profile"


def test_hold_and_release_through_the_api(launch, drive, api) -> None:
    run = drive(launch([final("hi")]))
    refused = api("lena").post(f"/api/runs/{run.pk}/hold", {"reason": "x"})
    assert refused.status_code == 403
    assert api("otto").post(f"/api/runs/{run.pk}/hold", {"reason": "  "}).status_code == 400
    held = api("otto").post(f"/api/runs/{run.pk}/hold", {"reason": "legal asked"})
    assert held.status_code == 200, held.data
    assert held.data["hold"]["reason"] == "legal asked" and held.data["hold"]["by"] == "otto"
    assert api("otto").get(f"/api/runs/{run.pk}").data["hold"]["scope"] == "run"
    assert retention.purge(actor="test", older_than_days=0).runs == 0
    released = api("otto").post(f"/api/runs/{run.pk}/release")
    assert released.status_code == 200 and released.data["hold"] is None
    assert retention.purge(actor="test", older_than_days=0).runs == 1
    again = api("otto").post(f"/api/runs/{run.pk}/hold", {"reason": "too late"})
    assert again.status_code == 409 and again.data["error"] == "purged"
    assert api("otto").post("/api/runs/999999/hold", {"reason": "x"}).status_code == 404


def test_the_run_page_holds_and_releases(launch, drive, otto) -> None:
    run = drive(launch([final("hi")]))
    client = client_for(otto)
    assert b"Hold run" in client.get(f"/runs/{run.pk}/").content
    csrf_post(client, f"/runs/{run.pk}/hold/", {"reason": "keep <b>this</b>"})
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "On legal hold" in page and "keep &lt;b&gt;this&lt;/b&gt;" in page and "Release hold" in page
    csrf_post(client, f"/runs/{run.pk}/release/")
    run.refresh_from_db()
    assert run.hold_reason == ""


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_dry_run_changes_nothing(launch, drive, rita) -> None:
    run = decided_run(launch, drive, rita)
    rows = {m: m.objects.count() for m in (Message, Transition, ToolCall)}
    out = purge_cmd("--older-than", "0", "--dry-run")
    assert "would purge 1 run(s)" in out and "messages" in out and "bytes" in out
    assert {m: m.objects.count() for m in (Message, Transition, ToolCall)} == rows
    run.refresh_from_db()
    assert run.purged_at is None and SECRET in run.task
    assert not PurgeRecord.objects.exists()


def test_retention_follows_the_deployment_and_each_profile(launch, drive, settings) -> None:
    old, fresh = drive(launch([final("a")])), drive(launch([final("b")]))
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - dt.timedelta(days=40))
    settings.AIRLOCK_RETENTION_DAYS = None
    assert retention.purge(actor="schedule").runs == 0  # unset: keep everything
    assert "no retention is set" in purge_cmd()
    assert not PurgeRecord.objects.exists()  # and that was no purge
    settings.AIRLOCK_RETENTION_DAYS = 30
    AgentProfile.objects.filter(name="scripted").update(retention_days=60)
    assert retention.purge(actor="schedule").runs == 0  # the profile keeps longer
    AgentProfile.objects.filter(name="scripted").update(retention_days=None)
    report = retention.purge(actor="schedule")
    assert report.run_ids == [old.pk]
    fresh.refresh_from_db()
    assert fresh.purged_at is None
    assert Run.objects.get(pk=old.pk).purge_retention_days == 30
    latest = PurgeRecord.objects.first()  # newest first; the one that found nothing is on record too
    assert (PurgeRecord.objects.count(), latest.actor, latest.runs) == (2, "schedule", 1)


def test_the_daily_job_purges_what_is_due(launch, drive, settings) -> None:
    from agents import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["purge-runs"]
    assert entry["task"] == tasks.purge_runs.name and entry["schedule"] == 86_400
    old = drive(launch([final("a")]))
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - dt.timedelta(days=8))
    settings.AIRLOCK_RETENTION_DAYS = 7
    assert tasks.purge_runs() == {"runs": 1, "bytes": PurgeRecord.objects.get().bytes}
    assert Run.objects.get(pk=old.pk).purged_at is not None


def test_unfinished_runs_are_never_purged(launch, drive) -> None:
    waiting = drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry=1), final()]))
    assert waiting.state == "awaiting_approval"
    assert retention.purge(actor="test", older_than_days=0).runs == 0


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_export_runs_writes_jsonl_checked_by_its_manifest(launch, drive, rita, tmp_path: Path) -> None:
    run = decided_run(launch, drive, rita)
    out = tmp_path / "archive"
    since = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    until = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    call_command("export_runs", "--since", since, "--until", until, "--out", str(out), stdout=io.StringIO())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["runs"] == 1 and manifest["counts"]["transitions"] == run.transitions.count()
    assert check_archive(out) == []
    line = json.loads((out / "runs.jsonl").read_text())
    assert line["run"]["id"] == run.pk and line["approvals"][0]["note"] == f"ok for {SECRET}"
    assert len(line["messages"]) == run.messages_count and line["journal"][1]["tool"] == "ledger_write"
    (out / "runs.jsonl").write_text((out / "runs.jsonl").read_text().replace("jane", "john"))
    assert check_archive(out) == ["runs.jsonl: sha256 differs from the manifest"]
    with pytest.raises(CommandError):
        call_command("export_runs", "--since", "yesterday", "--until", until, "--out", str(out))


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_purge_exports_exactly_what_it_purges_first_and_nothing_if_the_export_fails(
    launch, drive, rita, otto, tmp_path
) -> None:
    run = decided_run(launch, drive, rita)
    held = drive(launch([final("kept")]))
    run_hold(run_id=held.pk, user=otto, reason="hold")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CommandError, match="nothing purged"):
        purge_cmd("--older-than", "0", "--export-to", str(blocker / "sub"))
    run.refresh_from_db()
    assert run.purged_at is None and not PurgeRecord.objects.exists()

    out = tmp_path / "before-purge"
    text = purge_cmd("--older-than", "0", "--export-to", str(out))
    assert "exported 1 run(s)" in text and "purged 1 run(s)" in text
    assert check_archive(out) == []
    lines = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [x["run"]["id"] for x in lines] == [run.pk] and SECRET in lines[0]["run"]["task"]
    assert PurgeRecord.objects.get().exported_to == str(out)


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_purge_while_runs_are_driven_loses_no_live_run(launch, drive, settings) -> None:
    settings.AIRLOCK_PURGE_BATCH = 2
    finished = [drive(launch([call("echo", text=f"old {i}"), final("old")])) for i in range(8)]
    live = [launch([call("echo", text=f"new {i}"), call("echo", text="again"), final("new")]) for i in range(6)]
    errors: list[BaseException] = []

    def drive_all() -> None:
        try:
            for run in live:
                driver.drive(run.pk)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=drive_all)
    thread.start()
    report = retention.purge(actor="test", older_than_days=0)
    thread.join(timeout=120)
    assert not thread.is_alive() and errors == []
    assert set(report.run_ids) >= {r.pk for r in finished}
    for run in live:
        run.refresh_from_db()
        assert run.state == "done", (run.pk, run.state, run.error)
        if run.purged_at is None:
            assert run.messages_count == Message.objects.filter(run=run).count()
    for run in Run.objects.all():
        assert verify_run(run) == [], run.pk


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_purge_pauses_between_batches_holding_nothing_and_still_purges_everything(
    launch, drive, settings, monkeypatch
) -> None:
    """AIRLOCK_PURGE_PAUSE_MS: each pause comes after a batch has committed (its runs are
    tombstones for everyone) and outside any transaction; the purge still takes every
    due run and writes one record of them all."""
    settings.AIRLOCK_PURGE_BATCH = 2
    settings.AIRLOCK_PURGE_PAUSE_MS = 5
    finished = [drive(launch([call("echo", text=f"old {i} {SECRET}"), final("old")])) for i in range(5)]
    pauses: list[tuple[float, bool, int]] = []
    sleep, purging = time.sleep, threading.get_ident()

    def pause(seconds: float) -> None:
        if threading.get_ident() == purging:  # not another thread's sleep (the driver's pools)
            pauses.append((seconds, connection.in_atomic_block, Run.objects.filter(purged_at__isnull=False).count()))
        sleep(seconds)

    monkeypatch.setattr(retention.time, "sleep", pause)
    report = retention.purge(actor="test", older_than_days=0)
    monkeypatch.undo()
    assert pauses == [(0.005, False, 2), (0.005, False, 4)]
    assert sorted(report.run_ids) == sorted(r.pk for r in finished)
    record = PurgeRecord.objects.get()
    assert (record.runs, record.finished_at is not None) == (5, True)
    assert tables_holding(SECRET) == []
    for run in Run.objects.all():
        assert verify_run(run) == [], run.pk


@requires_postgres()
@pytest.mark.django_db(transaction=True)  # each commit's xmin: rows written in one test transaction share one
def test_a_transition_already_a_skeleton_is_not_rewritten(launch, drive) -> None:
    """A purge rewrites only the payloads it changes: a row it would write back as it
    is costs WAL and a dead tuple for nothing."""
    run = drive(launch([call("echo", text=f"old {SECRET}"), final("old")]))
    first, *rest = Transition.objects.filter(run=run).order_by("seq")
    Transition.objects.filter(pk=first.pk).update(payload=retention.skeleton(first.payload))

    def xmin(pk: int) -> str:
        with connection.cursor() as cur:
            cur.execute("select xmin::text from agents_transition where id = %s", [pk])
            return str(cur.fetchone()[0])

    before = {t.pk: xmin(t.pk) for t in (first, *rest)}
    assert retention.purge(actor="test", older_than_days=0).run_ids == [run.pk]
    assert xmin(first.pk) == before[first.pk]
    assert all(xmin(t.pk) != before[t.pk] for t in rest)
    assert tables_holding(SECRET) == [] and verify_run(Run.objects.get(pk=run.pk)) == []


@pytest.mark.django_db(transaction=True)  # threads racing see only committed rows
@requires_postgres()
def test_a_purge_batch_left_open_blocks_no_live_commit(launch, drive) -> None:
    """Hold a purge in the middle of its batch (another connection keeps a lock on one
    journal row it must rewrite): the batch's transaction stays open with its runs
    locked, and a live run still goes from queued to done meanwhile."""
    import psycopg

    finished = drive(launch([call("echo", text="old"), final("old")]))
    live = launch([call("echo", text="new"), final("new")])
    db = connection.settings_dict
    params = {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"], "dbname": db["NAME"]}
    locker = psycopg.connect(**params)
    # Its own connection, outside any transaction: a transaction reads pg_stat_activity once.
    watcher = psycopg.connect(**params, autocommit=True)
    purger = drover = None
    try:
        locker.execute("select 1 from agents_toolcall where run_id = %s for update", [finished.pk])
        outcome: dict[str, Any] = {}

        def in_thread(name: str, fn: Any) -> threading.Thread:
            def target() -> None:
                try:
                    outcome[name] = fn()
                except BaseException as exc:  # reported in the test's thread
                    outcome[name] = exc
                finally:
                    connection.close()

            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            return thread

        purger = in_thread("purge", lambda: retention.purge(actor="test", older_than_days=0))
        waiting = "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query like %s"
        wait_for(lambda: watcher.execute(waiting, ['UPDATE "agents_toolcall"%']).fetchone()[0] == 1, what="purge blocked")

        drover = in_thread("drive", lambda: driver.drive(live.pk))
        drover.join(timeout=120)  # a guard against a hang, not a measurement
        assert not drover.is_alive(), "the live run waited on the purge's locks"
        assert Run.objects.get(pk=live.pk).state == "done", outcome.get("drive")
        assert purger.is_alive(), "the purge batch should still be open"
    finally:
        locker.rollback()
        locker.close()
        watcher.close()
    purger.join(timeout=120)
    report = outcome["purge"]
    assert not isinstance(report, BaseException), report
    assert finished.pk in report.run_ids and live.pk not in report.run_ids
    assert Run.objects.get(pk=finished.pk).purged_at is not None


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
@pytest.mark.parametrize("days", [7, 30])
def test_a_purge_leaves_the_review_statistics_of_past_windows_unchanged(launch, drive, rita, days: int) -> None:
    """The stats page reads the decision chain a purge keeps (who, when, decision, rule),
    so its figures for a window are the same after the purge as before (issue 31)."""
    for _ in range(3):
        decided_run(launch, drive, rita)
    now = timezone.now()

    def figures() -> tuple[Any, ...]:
        s = stats.stats(rita, days=days, now=now)
        return (s.overall, s.reviewers, s.agents, s.rules, [b.timing for b in s.chart.buckets], s.escalations)

    before = figures()
    assert before[0].n == 3  # three decided calls in the window
    assert retention.purge(actor="test", older_than_days=0).runs == 3
    assert Run.objects.filter(purged_at__isnull=False).count() == 3
    assert figures() == before


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_purge_forgets_the_values_a_history_rules_figures_named(launch, drive, rita) -> None:
    rule = {"tool": "ledger_write", "then": "ask", "reason": "a second entry for one customer",
            "history": {"scope": "run", "calls_over": 1, "same": ["entry.customer"]}}
    script = [call("ledger_write", entry={"customer": SECRET, "n": n}) for n in range(2)]
    run = drive(launch([*script, final("ok")], policy={"rules": [rule]}))
    approval = Approval.objects.get(run=run)
    assert SECRET in approval.reason and approval.history["same"] == {"entry.customer": SECRET}
    approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="no")
    assert drive(run).state == "done"

    purge_cmd("--older-than", "0")

    assert tables_holding(SECRET) == []
    approval.refresh_from_db()
    assert approval.reason == "a second entry for one customer"
    assert (approval.history["count"], approval.history["calls_over"]) == (1, 1)
    assert verify_run(Run.objects.get(pk=run.pk)) == []
