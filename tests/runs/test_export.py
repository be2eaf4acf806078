from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from agents.models import LedgerEntry
from tests.helpers import call, client_for, csrf_post, final

pytestmark = pytest.mark.django_db


def test_owner_downloads_the_run_as_json(launch, drive, lena) -> None:
    run = drive(launch([call("echo", text="hello"), final("bye")], user=lena, task="say hello"))
    response = client_for(lena).get(f"/runs/{run.pk}/export/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response["Content-Disposition"] == f'attachment; filename="airlock-run-{run.pk}.json"'
    doc = json.loads(response.content)
    assert doc["format"] == "airlock-run/1" and doc["task"] == "say hello"
    assert doc["run"]["id"] == run.pk and doc["run"]["state"] == "done" and doc["run"]["answer"] == "bye"
    assert [t["seq"] for t in doc["transitions"]] == list(range(1, run.version + 1))
    assert doc["script"][0]["calls"][0]["tool"] == "echo" and doc["script"][1] == {"final": "bye"}


def test_reviewer_may_export_but_another_launcher_may_not(launch, lena, leo, rita) -> None:
    run = launch([final()], user=lena)
    assert client_for(rita).get(f"/runs/{run.pk}/export/").status_code == 200
    assert client_for(leo).get(f"/runs/{run.pk}/export/").status_code == 404


def test_export_refuses_post(launch, otto) -> None:
    run = launch([final()], user=otto)
    assert client_for(otto, csrf=False).post(f"/runs/{run.pk}/export/").status_code == 405


def test_an_operator_saves_a_run_as_an_eval_case_that_replays(launch, drive, otto, lena, settings, tmp_path) -> None:
    """"Save as eval case" writes the export, recorded tool results included, where
    run_evals reads cases; the case replays without running a tool."""
    settings.AIRLOCK_EVALS_DIR = tmp_path / "evals"
    run = drive(launch([call("ledger_write", entry="pay 5"), final("paid")], user=lena))
    page = client_for(otto).get(f"/runs/{run.pk}/").content.decode()
    assert "Save as eval case" in page
    assert "Save as eval case" not in client_for(lena).get(f"/runs/{run.pk}/").content.decode()
    response = csrf_post(client_for(otto), f"/runs/{run.pk}/eval-case/")
    assert response.status_code == 302
    saved = tmp_path / "evals" / f"run-{run.pk}.json"
    case = json.loads(saved.read_text())
    assert case["tool_results"] == [{"tool": "ledger_write", "args": {"entry": "pay 5"},
                                     "result": run.tool_calls.get().result}]
    assert case["tools"] == "replay" and case["expect"] == {"state": "done", "answer": "paid"}
    entries = LedgerEntry.objects.count()
    out = io.StringIO()
    call_command("run_evals", str(saved), stdout=out)
    assert "1 case(s), 1 passed, 0 failed" in out.getvalue()
    assert LedgerEntry.objects.count() == entries
    assert csrf_post(client_for(lena), f"/runs/{run.pk}/eval-case/").status_code == 403
