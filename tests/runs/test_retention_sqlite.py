"""The purge on the embedded default, SQLite: the same tombstone as on PostgreSQL, in a
fresh database of its own (a subprocess: the suite's own database is PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import on_fresh_sqlite

SCENARIO = """
import django, io, json, sqlite3, sys
django.setup()
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from agents.actions.approvals import approval_decide
from agents.actions.runs import run_hold, run_launch
from agents.models import Approval, Run, ToolCall
from agents.runs import driver
from agents.runs.verify import verify_run

SECRET = "PLANTED-sqlite-4411"
rita = User.objects.create_user("rita")
rita.groups.add(Group.objects.get(name="reviewer"))
otto = User.objects.create_user("otto")
otto.groups.add(Group.objects.get(name="operator"))

def script(secret):
    return [
        {"call": {"tool": "fetch_fixture", "args": {"text": "page " + secret}}},
        {"call": {"tool": "ledger_write", "args": {"entry": "refund " + secret}}},
        {"final": "answered " + secret},
    ]

runs = [run_launch(agent="scripted", task="help " + s, script=script(s)) for s in (SECRET, "KEPT-9")]
for run, secret in zip(runs, (SECRET, "KEPT-9")):
    driver.drive(run.pk)
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="ok " + secret)
    driver.drive(run.pk)
run_hold(run_id=runs[1].pk, user=otto, reason="held")
out = io.StringIO()
call_command("purge_runs", "--older-than", "0", stdout=out)
purged, held = (Run.objects.get(pk=r.pk) for r in runs)
verified = io.StringIO()
call_command("verify_runs", stdout=verified)
db = sqlite3.connect(sys.argv[1])
tables = [t for (t,) in db.execute("select name from sqlite_master where type = 'table'")]
holding = sorted(
    t for t in tables
    if t != "agents_ledgerentry" and any(SECRET in str(row) for row in db.execute(f'select * from "{t}"'))
)
approval = Approval.objects.get(run=purged)
print(json.dumps({
    "out": out.getvalue(), "verified": verified.getvalue(), "holding": holding,
    "states": [purged.state, held.state], "purged": [purged.purged_at is not None, held.purged_at is not None],
    "held_task": held.task, "decided_by": approval.decided_by.username, "hash_kept": bool(approval.args_sha256),
    "journal_hash": ToolCall.objects.get(run=purged, tool="ledger_write").args_sha256 == approval.args_sha256,
    "problems": verify_run(purged),
}))
"""


def test_purge_then_verify_on_sqlite(tmp_path: Path) -> None:
    found = on_fresh_sqlite(tmp_path, SCENARIO, str(tmp_path / "airlock.sqlite3"))
    assert "purged 1 run(s)" in found["out"]
    assert "2 run(s) checked, 0 inconsistent" in found["verified"]
    assert found["holding"] == []
    assert found["states"] == ["done", "done"] and found["purged"] == [True, False]
    assert found["held_task"] == "help KEPT-9"
    assert found["decided_by"] == "rita" and found["hash_kept"] and found["journal_hash"]
    assert found["problems"] == []
