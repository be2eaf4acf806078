"""Management commands a first day meets: they say what they refuse, once, and never
replace an archive unasked (#47, item 6)."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from agents.models import Webhook
from tests.helpers import final

pytestmark = pytest.mark.django_db


def _range() -> tuple[str, str]:
    now = timezone.now()
    return (now - dt.timedelta(hours=1)).isoformat(), (now + dt.timedelta(hours=1)).isoformat()


def test_export_runs_refuses_to_replace_an_archive_without_force(launch, drive, tmp_path: Path) -> None:
    drive(launch([final("first")]))
    since, until = _range()
    out = tmp_path / "archive"
    call_command("export_runs", "--since", since, "--until", until, "--out", str(out), stdout=io.StringIO())
    first = (out / "runs.jsonl").read_bytes()
    drive(launch([final("second")]))

    with pytest.raises(CommandError, match="already holds an archive.*--force"):
        call_command("export_runs", "--since", since, "--until", until, "--out", str(out), stdout=io.StringIO())
    assert (out / "runs.jsonl").read_bytes() == first  # nothing written

    call_command("export_runs", "--since", since, "--until", until, "--out", str(out), "--force", stdout=io.StringIO())
    assert json.loads((out / "manifest.json").read_text())["counts"]["runs"] == 2


def test_export_runs_writes_into_an_empty_existing_directory(launch, drive, tmp_path: Path) -> None:
    drive(launch([final("one")]))
    since, until = _range()
    call_command("export_runs", "--since", since, "--until", until, "--out", str(tmp_path), stdout=io.StringIO())
    assert json.loads((tmp_path / "manifest.json").read_text())["counts"]["runs"] == 1


def test_add_webhook_says_a_refused_url_once(defaults) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("add_webhook", "ftp://x", "--events", "run.done", stdout=io.StringIO())
    message = str(caught.value)
    assert message == "url: Enter a valid URL."
    assert not Webhook.objects.exists()
