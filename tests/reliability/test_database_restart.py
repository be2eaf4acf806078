"""PostgreSQL goes away mid-run and comes back: a PRIVATE cluster started by the test
(the shared server is never restarted), with a real web server, worker and beat on it.

While it is down the API answers a JSON 503 and pages a plain 503, never a 500; once
it is back the same worker processes (health-checked connections) finish every run,
with contiguous `seq` and one ledger row per run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import wait_for
from tests.reliability.servers import SUPERUSER, PrivatePostgres, login, manage, pg_bin_available, start_web
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS

SCRIPT = [
    {"call": {"tool": "sleep", "args": {"seconds": 1.5}}},
    {"call": {"tool": "ledger_write", "args": {"entry": "booked"}}},
    {"call": {"tool": "echo", "args": {"text": "after the outage"}}},
    {"final": "survived the restart"},
]


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    assert pg_bin_available(), "PostgreSQL's server programs (initdb, pg_ctl) are not installed"
    server = PrivatePostgres()
    server.init()
    try:
        yield server
    finally:
        server.destroy()


def states(api: httpx.Client, ids: list[int]) -> list[str]:
    return [api.get(f"/api/runs/{pk}").json().get("state", "?") for pk in ids]


def test_postgres_restart_mid_run(cluster: Cluster, postgres: PrivatePostgres) -> None:
    env = cluster.env(DATABASE_URL=postgres.url, DB_CONN_MAX_AGE="60")
    manage(env, "migrate", "--noinput", "-v0")
    token = manage(env, code=SUPERUSER).strip().splitlines()[-1]
    worker = cluster.start_worker("w1", concurrency=2, DATABASE_URL=postgres.url, DB_CONN_MAX_AGE="60")
    cluster.start_beat(DATABASE_URL=postgres.url)
    base = start_web(cluster, env)
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=15)
    page = login(base, "ops", "ops-password-123")

    ids = []
    for i in range(4):
        answer = api.post("/api/runs", json={"agent": "scripted", "task": f"outage {i}", "script": SCRIPT})
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    wait_for(lambda: "acting" in states(api, ids), what="a run mid-step")

    postgres.stop("fast")
    try:
        down = api.get(f"/api/runs/{ids[0]}")
        assert down.status_code == 503, down.text[:500]
        assert down.headers["content-type"] == "application/json"
        assert down.json()["error"] == "unavailable" and down.headers["Retry-After"]
        refused = api.post("/api/runs", json={"agent": "scripted", "task": "during the outage", "script": SCRIPT})
        assert refused.status_code == 503 and refused.json()["error"] == "unavailable"
        for path in ("/runs/", f"/runs/{ids[0]}/", "/reviews/"):
            shown = page.get(path)
            assert shown.status_code == 503, (path, shown.status_code, shown.text[:300])
            assert shown.headers["content-type"].startswith("text/plain")
            assert "Traceback" not in shown.text and "<html" not in shown.text.lower()
            assert "database is unavailable" in shown.text
        time.sleep(2)  # the worker and the sweeper meet the outage too
    finally:
        postgres.start()

    wait_for(lambda: states(api, ids) == ["done"] * 4, timeout=120, what="every run to finish after the restart")
    assert worker.poll() is None, "the worker survived the outage (no restart)"
    assert page.get(f"/runs/{ids[0]}/").status_code == 200
    for pk in ids:
        seqs = [t["seq"] for t in api.get(f"/api/runs/{pk}/transitions").json()]
        assert seqs == list(range(1, len(seqs) + 1)), (pk, seqs)
        [(rows,)] = postgres.query("SELECT count(*) FROM agents_ledgerentry WHERE run_id = %s", pk)
        assert rows == 1, pk
    [(answers,)] = postgres.query("SELECT count(DISTINCT answer) FROM agents_run WHERE id = ANY(%s)", ids)
    assert answers == 1
    assert "Internal Server Error" not in cluster.log("web")
