"""Structured logs: with LOG_FORMAT=json every record is one JSON object on one line,
carrying the run id and the run's trace id while a worker drives a run."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from contextvars import ContextVar

_run_id: ContextVar[int | None] = ContextVar("airlock_run_id", default=None)
_trace_id: ContextVar[str | None] = ContextVar("airlock_trace_id", default=None)


def trace_id_of(traceparent: str) -> str | None:
    """The trace id of a W3C traceparent ("00-<trace id>-<span id>-<flags>")."""
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def bind_run(run_id: int, traceparent: str = "") -> Callable[[], None]:
    """Log records made from now on name this run (and its trace, if it has one);
    call the returned function to stop."""
    run_token = _run_id.set(run_id)
    trace_token = _trace_id.set(trace_id_of(traceparent) if traceparent else None)

    def unbind() -> None:
        _trace_id.reset(trace_token)
        _run_id.reset(run_token)

    return unbind


class RunContextFilter(logging.Filter):
    """Puts `run_id` and `trace_id` on every record (None outside a run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) is None:
            record.run_id = _run_id.get()
        if getattr(record, "trace_id", None) is None:
            record.trace_id = _trace_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("run_id", "trace_id"):
            value = getattr(record, key, None)
            if value is not None:
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)
