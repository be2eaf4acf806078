from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from agents.models import AgentProfile, LedgerEntry, Run
from agents.runs import retention
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


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
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


def test_a_purged_run_is_not_saved_as_an_eval_case_and_the_page_says_why(
    launch, drive, otto, settings, tmp_path
) -> None:
    settings.AIRLOCK_EVALS_DIR = tmp_path / "evals"
    run = drive(launch([call("echo", text="hi"), final("ok")], user=otto))
    retention.purge(actor="test", older_than_days=0)
    page = client_for(otto).get(f"/runs/{run.pk}/").content.decode()
    assert "Not for a purged run: its task, decisions and tool results are gone" in page
    assert f'action="/runs/{run.pk}/eval-case/"' not in page
    # The form's old copy (or a script) posting anyway is refused with the reason.
    response = csrf_post(client_for(otto), f"/runs/{run.pk}/eval-case/", follow=True)
    assert response.status_code == 200
    assert f"Not saved as an eval case: run {run.pk}&#x27;s content was purged on" in response.content.decode()
    assert not (tmp_path / "evals").exists()


def test_a_case_of_a_local_profile_is_marked_and_says_so_where_the_profile_is_missing(
    launch, drive, otto, settings, tmp_path
) -> None:
    settings.AIRLOCK_EVALS_DIR = tmp_path / "evals"
    scripted = AgentProfile.objects.get(name="scripted")
    AgentProfile.objects.create(name="finance-bot", provider="scripted", tools=scripted.tools)
    local = drive(launch([final("ok")], agent="finance-bot", user=otto))
    shipped = drive(launch([final("ok")], user=otto))
    for run in (local, shipped):
        assert csrf_post(client_for(otto), f"/runs/{run.pk}/eval-case/").status_code == 302
    local_case = json.loads((tmp_path / "evals" / f"run-{local.pk}.json").read_text())
    assert local_case["requires_profile"] == "finance-bot"
    assert "requires_profile" not in json.loads((tmp_path / "evals" / f"run-{shipped.pk}.json").read_text())

    out = io.StringIO()
    call_command("run_evals", str(tmp_path / "evals"), stdout=out)  # the profile is here: both replay
    assert "2 case(s), 2 passed, 0 failed" in out.getvalue()
    Run.objects.filter(profile__name="finance-bot").delete()
    AgentProfile.objects.filter(name="finance-bot").delete()
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("run_evals", str(tmp_path / "evals"), stdout=out)
    saved_elsewhere = "the case was saved from a run of 'finance-bot', an agent profile of the deployment that saved it"
    assert saved_elsewhere in out.getvalue()
    assert "2 case(s), 1 passed, 1 failed" in out.getvalue()


def test_dashboard_cases_go_under_var_not_into_the_shipped_evals() -> None:
    from django.conf import settings

    assert settings.AIRLOCK_EVALS_DIR == settings.VAR_DIR / "evals"
    assert settings.AIRLOCK_EVALS_DIR.resolve() != (settings.BASE_DIR / "evals").resolve()
