"""The real-server fixtures of the worker and reliability tests: worker/web processes,
a private Redis and a private PostgreSQL cluster the tests may stop."""

from __future__ import annotations

from tests.reliability.conftest import own_redis  # noqa: F401
from tests.reliability.test_database_restart import postgres  # noqa: F401
