"""`make bench`'s raw-limit scaling (one writer process, then two) at a tiny scale, so it
does not rot; the figures themselves are the bench's to print, not a test's to judge."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from psycopg.conninfo import make_conninfo

from bench import run as bench
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


@pytest.mark.process
def test_raw_scaling_runs_one_then_two_writer_processes_and_cleans_up() -> None:
    s = connection.settings_dict
    url = make_conninfo(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"], host=s["HOST"], port=s["PORT"])

    out = bench.raw_scaling(seconds=0.2, order=(1, 2), url=url)

    assert out["writers_1"] > 0 and out["writers_2"] > 0
    assert out["scaling_2_to_1"] == out["writers_2"] / out["writers_1"]
    with psycopg.connect(url) as conn:
        assert conn.execute("select to_regclass('bench_raw_writers')").fetchone() == (None,)
