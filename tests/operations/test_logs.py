"""LOG_FORMAT=json: one JSON object per line, with the run id and trace id where known."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.test import override_settings

from agents.ops import telemetry
from agents.ops.logs import JsonFormatter, RunContextFilter
from tests.helpers import call, final
from tests.workers.cluster import BASE

pytestmark = pytest.mark.django_db


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RunContextFilter())
    logger = logging.getLogger("airlock")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


def test_a_driven_run_logs_its_run_id_and_trace_id(json_lines: io.StringIO, launch, drive) -> None:
    with override_settings(AIRLOCK_OTEL=True):
        run = launch([call("echo", text="hi\nforged line"), final()])
    try:
        drive(run)
    finally:
        telemetry.reset()
    records = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    committed = [r for r in records if r["message"].startswith(f"committed run={run.pk} ")]
    assert len(committed) == run.transitions.count() - 1  # every transition after the launch
    trace_id = run.trace_context.split("-")[1]
    assert {(r["run_id"], r["trace_id"], r["logger"], r["level"]) for r in committed} == {
        (run.pk, trace_id, "airlock.store", "INFO")
    }


def test_outside_a_run_there_is_no_run_id(json_lines: io.StringIO) -> None:
    logging.getLogger("airlock.test").warning("a line\nwith a newline")
    [record] = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    assert record["message"] == "a line\nwith a newline" and "run_id" not in record and "trace_id" not in record


def settings_process(log_format: str) -> subprocess.CompletedProcess[str]:
    code = "import django, logging; django.setup(); logging.getLogger('airlock.test').warning('hello %s', 42)"
    env = {"DJANGO_SETTINGS_MODULE": "config.settings", "PATH": "/usr/bin:/bin", "LOG_FORMAT": log_format,
           "AIRLOCK_VAR_DIR": str(BASE / "var")}
    return subprocess.run([sys.executable, "-c", code], cwd=BASE, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_the_setting_switches_the_console_to_json() -> None:
    done = settings_process("json")
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert json.loads(line)["message"] == "hello 42"
    refused = settings_process("yaml")
    assert refused.returncode != 0 and "LOG_FORMAT must be plain or json" in refused.stderr
