from __future__ import annotations

import json

import pytest

from tests.helpers import call, client_for, final

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
