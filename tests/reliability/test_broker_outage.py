"""The broker (a PRIVATE redis-server started by the test) goes away or loses every
key; launches still commit, and the sweeper gets every run finished.

The web server, worker and beat are real processes pointed at that Redis; the shared
Redis is never stopped or flushed.
"""

from __future__ import annotations

import time

import httpx
from django.contrib.auth.models import User

from agents.actions.tokens import token_create
from agents.models import LedgerEntry, Run
from agents.runs.verify import verify_run
from tests.helpers import wait_for
from tests.reliability.servers import RedisServer, start_web
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS

OUTAGE_SECONDS = 30


def script(i: int, nap: float = 0.2) -> list[dict]:
    return [
        {"call": {"tool": "sleep", "args": {"seconds": nap}}},
        {"call": {"tool": "ledger_write", "args": {"entry": f"entry {i}"}}},
        {"final": f"answer {i}"},
    ]


def api_client(cluster: Cluster, redis: RedisServer) -> httpx.Client:
    user = User.objects.create_superuser("ops", "ops@example.com", "ops-password-123")
    _, token = token_create(user=user)
    base = start_web(cluster, cluster.env(REDIS_URL=redis.url))
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def finished(ids: list[int]) -> int:
    return Run.objects.filter(pk__in=ids, state="done").count()


def check_runs(ids: list[int]) -> None:
    for run in Run.objects.filter(pk__in=ids):
        assert verify_run(run) == [], run.pk
        seqs = list(run.transitions.order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1)), run.pk
        assert LedgerEntry.objects.filter(run=run).count() == 1, run.pk


def test_redis_down_for_30_seconds_while_20_runs_are_launched(cluster: Cluster, own_redis: RedisServer) -> None:
    cluster.redis_url = own_redis.url
    worker = cluster.start_worker("w1", concurrency=2)
    beat = cluster.start_beat()
    api = api_client(cluster, own_redis)

    own_redis.stop()
    stopped = time.monotonic()
    ids = []
    for i in range(20):
        answer = api.post("/api/runs", json={"agent": "scripted", "task": f"outage {i}", "script": script(i)})
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    assert Run.objects.filter(pk__in=ids, state="queued").count() == 20  # committed, waiting for a worker
    assert cluster.log("web").count("not sent") >= 20  # each wake-up failed, logged, not raised
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
    assert finished(ids) == 0
    own_redis.start()

    wait_for(lambda: finished(ids) == 20, timeout=180, what="all 20 runs to finish after Redis returned")
    assert worker.poll() is None and beat.poll() is None, "the same processes consumed again, no restart"
    assert "sweep failed=0 woken=" in cluster.log("w1")
    check_runs(ids)


def test_flushall_mid_run_the_sweeper_recovers_every_run(cluster: Cluster, own_redis: RedisServer) -> None:
    cluster.redis_url = own_redis.url
    worker = cluster.start_worker("w1", concurrency=2)
    cluster.start_beat()
    api = api_client(cluster, own_redis)
    ids = []
    for i in range(10):
        answer = api.post("/api/runs", json={"agent": "scripted", "task": f"flush {i}", "script": script(i, 1.0)})
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    wait_for(lambda: Run.objects.filter(pk__in=ids, state="acting").exists(), what="a run mid-step")
    before = cluster.log("w1").count("sweep failed=0 woken=")
    own_redis.flushall()  # every queued and unacknowledged wake-up, and kombu's bindings, gone
    wait_for(lambda: finished(ids) == 10, timeout=180, what="the sweeper to recover all 10 runs")
    assert worker.poll() is None
    assert cluster.log("w1").count("sweep failed=0 woken=") > before  # the sweeper, not luck
    check_runs(ids)
