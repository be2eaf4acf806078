"""Long polls against the real threaded server: many clients waiting on held calls
share the process's small connection pool, and the decision reaches them all."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User

from agents.actions import external
from agents.actions.tokens import token_create
from tests.helpers import at_once, requires_postgres

ASK_CRM = {"tool": "crm_update", "then": "ask", "reason": "a human reads CRM notes first"}
WAITERS = 30


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_thirty_long_polls_outnumbering_the_pool_all_get_the_decision(
    live_server: Any, api, external_run, monkeypatch
) -> None:
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {})
    assert pool and pool["max_size"] < WAITERS, "the test needs more waiters than pooled connections"
    run_id = external_run(policy={"rules": [ASK_CRM]})
    # Waiting polls give their connection back between reads: held instead, the pool's
    # ten would be taken by the first ten waiters and the rest would get 503s.
    held = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "A", "note": "n"}}).data
    _token, lena = token_create(user=User.objects.get(username="lena"))
    _token, rita = token_create(user=User.objects.get(username="rita"))

    sleepers: set[int] = set()
    all_waiting = threading.Event()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        sleepers.add(threading.get_ident())
        if len(sleepers) >= WAITERS:
            all_waiting.set()
        real_sleep(seconds)

    monkeypatch.setattr(external.time, "sleep", sleep)
    url = f"{live_server.url}/api/runs/{run_id}/calls/{held['key']}?wait=25"

    def wait(_: int) -> tuple[int, str]:
        response = httpx.get(url, headers={"Authorization": f"Bearer {lena}"}, timeout=40)
        return response.status_code, response.json().get("status", response.text)

    def decide() -> None:
        assert all_waiting.wait(20), f"only {len(sleepers)} of {WAITERS} polls were waiting"
        httpx.post(
            f"{live_server.url}/api/approvals/{held['approval']['id']}/decision",
            json={"decision": "approve"}, headers={"Authorization": f"Bearer {rita}"}, timeout=20,
        ).raise_for_status()

    reviewer = threading.Thread(target=decide)
    reviewer.start()
    answers = at_once(wait, range(WAITERS), timeout=60)
    reviewer.join(30)
    assert answers == [(200, "approved")] * WAITERS


@pytest.mark.django_db
def test_a_long_poll_reads_the_call_again_only_when_its_run_moves(api, external_run) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run_id = external_run(policy={"rules": [ASK_CRM]})
    held = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "A", "note": "n"}}).data
    lena = User.objects.get(username="lena")
    with CaptureQueriesContext(connection) as captured:
        answer = external.call_wait(run_id=run_id, key=held["key"], user=lena, wait=0.7)
    assert answer.status == external.PENDING
    sqls = [q["sql"] or "" for q in captured.captured_queries]
    version_reads = [s for s in sqls if s.startswith('SELECT "agents_run"."version"')]
    approval_reads = [s for s in sqls if 'FROM "agents_approval"' in s]
    # Each tick looks at the run only; the call's rows are read once, as the run never
    # moved (polling them, each tick read them again).
    assert version_reads
    assert len(approval_reads) == 1
