"""The web service as the image runs it (gunicorn with config/gunicorn.py): agents
waiting on held calls never stop the pages a reviewer needs to answer them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User

from agents.actions.tokens import token_create
from agents.models import ApiToken
from tests.helpers import database_url, free_port, listening, requires_postgres, wait_for

BASE = Path(__file__).resolve().parents[2]
ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}
THREADS = 4


@pytest.fixture
def gunicorn() -> Iterator[str]:
    """One gunicorn process of THREADS threads on the test database, with the project's
    config file and nothing else on the command line."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "WEB_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1",
           "WEB_THREADS": str(THREADS), "DB_CONN_MAX_AGE": "0"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi:application"],
        cwd=BASE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: listening(port), timeout=60, what="gunicorn")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_long_polls_on_held_calls_leave_the_pages_answering(gunicorn: str, api, external_run) -> None:
    """THREADS - 1 long polls wait on a held call (more than a sync worker's one request
    at a time): the login page and /healthz still answer while every poll waits, and
    an operator cancelling the run (on the last free thread) ends the polls with `expired`."""
    run_id = external_run(policy={"rules": [ASK_CRM]})
    held = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "A", "note": "n"}})
    assert held.data["status"] == "pending"
    lena = User.objects.get(username="lena")
    # A fresh token per poll: the server marks a token used when it reads it, so the
    # marks say that every poll is inside the server before the pages are asked for.
    tokens = [token_create(user=lena) for _ in range(THREADS - 1)]
    answers: list[tuple[int, str]] = []

    def poll(raw: str) -> None:
        response = httpx.get(f"{gunicorn}/api/runs/{run_id}/calls/{held.data['key']}?wait=30",
                             headers={"Authorization": f"Bearer {raw}"}, timeout=60)  # fmt: skip
        answers.append((response.status_code, response.json().get("status", response.text)))

    polls = [threading.Thread(target=poll, args=(raw,)) for _token, raw in tokens]
    for thread in polls:
        thread.start()
    wait_for(
        lambda: ApiToken.objects.filter(pk__in=[t.pk for t, _ in tokens], last_used_at__isnull=False).count() == len(tokens),
        timeout=30, what="every poll in the server",
    )  # fmt: skip
    page = httpx.get(f"{gunicorn}/login/", timeout=60)
    health = httpx.get(f"{gunicorn}/healthz", timeout=60)
    still_waiting = sum(thread.is_alive() for thread in polls)
    assert page.status_code == 200 and "Log in" in page.text and health.status_code == 200
    assert still_waiting == len(polls) and answers == []

    otto = token_create(user=User.objects.get(username="otto"))[1]
    cancelled = httpx.post(f"{gunicorn}/api/runs/{run_id}/cancel", headers={"Authorization": f"Bearer {otto}"},
                           timeout=60)  # fmt: skip
    assert cancelled.status_code == 200, cancelled.text
    for thread in polls:
        thread.join(timeout=60)
    assert answers == [(200, "expired")] * len(polls)
