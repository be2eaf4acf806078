"""/healthz and /readyz against real outages: a PRIVATE PostgreSQL cluster and a PRIVATE
Redis, each stopped and started by the test, under a real web server (runserver).

/healthz answers whatever is down (it asks nothing); /readyz answers 503 naming the
check that failed, and nothing about where the database or the broker live.
"""

from __future__ import annotations

import httpx

from tests.helpers import wait_for
from tests.reliability.conftest import RedisServer
from tests.reliability.servers import PrivatePostgres, manage, start_web
from tests.workers.cluster import MARKS, Cluster


def probe(base: str, path: str) -> httpx.Response:
    # As a load balancer asks: no cookie, no login, by address.
    return httpx.get(f"{base}{path}", timeout=10)


def assert_reveals_nothing(answer: httpx.Response, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in answer.text, (secret, answer.text)


pytestmark = MARKS


def test_database_down_healthz_still_answers_and_readyz_names_the_database(
    cluster: Cluster, postgres: PrivatePostgres, own_redis: RedisServer
) -> None:
    env = cluster.env(DATABASE_URL=postgres.url, REDIS_URL=own_redis.url, DB_CONN_MAX_AGE="60")
    base = start_web(cluster, env)

    # A fresh database without its tables: up, but not ready.
    answer = probe(base, "/readyz")
    assert answer.status_code == 503 and answer.json() == {"status": "unavailable", "failed": ["migrations"]}
    manage(env, "migrate", "--noinput", "-v0")
    assert probe(base, "/readyz").json() == {"status": "ready"}

    postgres.stop()
    health = probe(base, "/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    answer = probe(base, "/readyz")
    assert answer.status_code == 503 and answer.json() == {"status": "unavailable", "failed": ["database"]}
    assert_reveals_nothing(answer, str(postgres.port), "127.0.0.1", "postgres", str(own_redis.port))

    postgres.start()
    wait_for(lambda: probe(base, "/readyz").status_code == 200, timeout=30, what="ready again")
    assert probe(base, "/healthz").status_code == 200


def test_broker_down_readyz_names_the_broker(cluster: Cluster, own_redis: RedisServer) -> None:
    base = start_web(cluster, cluster.env(REDIS_URL=own_redis.url))
    assert probe(base, "/readyz").json() == {"status": "ready"}

    own_redis.stop()
    answer = probe(base, "/readyz")
    assert answer.status_code == 503 and answer.json() == {"status": "unavailable", "failed": ["broker"]}
    assert_reveals_nothing(answer, str(own_redis.port), "redis")
    assert probe(base, "/healthz").status_code == 200

    own_redis.start()
    wait_for(lambda: probe(base, "/readyz").status_code == 200, timeout=30, what="ready again")
