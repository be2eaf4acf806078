"""What the engine needs from the outside: a model, a journal, a tool runner, a clock,
and the history its history rules count."""

from __future__ import annotations

import concurrent.futures
import contextvars
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .history import History
from .registry import Registry, ToolContext, ToolError, ToolSpec, WithContent


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call. `input_tokens` counts the whole prompt; the two cache
    counts are parts of it that the provider bills at other rates."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0  # read from the provider's prompt cache
    cache_write_tokens: int = 0  # written to the prompt cache (Anthropic bills these higher)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        """The usage as recorded on a transition; cache counts only when there are any."""
        data = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.cached_input_tokens:
            data["cached_input_tokens"] = self.cached_input_tokens
        if self.cache_write_tokens:
            data["cache_write_tokens"] = self.cache_write_tokens
        return data


@dataclass(frozen=True)
class ProposedCall:
    """A call as the model proposed it; `args` may be anything the model sent."""

    id: str
    tool: str
    args: Any


@dataclass(frozen=True)
class ModelReply:
    """One model reply: a final answer, or one or more calls (with optional text)."""

    final: str | None = None
    calls: tuple[ProposedCall, ...] = ()
    text: str = ""
    usage: Usage | None = None

    def __post_init__(self) -> None:
        if (self.final is None) == (not self.calls):
            raise ValueError("a model reply is either a final answer or at least one call")


class ModelError(Exception):
    """The model could not give a reply (after the client's own retries)."""


@dataclass(frozen=True)
class ModelRequest:
    run_id: str
    turn: int  # how many model calls the run made before this one
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]


class ModelClient(Protocol):
    def propose(self, request: ModelRequest) -> ModelReply | None:
        """The model's reply. None only from a client whose replies come from
        outside Airlock (an external agent's proposed call, given through the API) and
        that has none yet: the run rests in `planning` until one arrives."""
        ...


@dataclass(frozen=True)
class JournalEntry:
    status: str  # intended | started | succeeded | failed
    result: Any = None


class Journal(Protocol):
    """The tool-call journal, keyed by idempotency key (the store implements it)."""

    def get(self, key: str) -> JournalEntry | None: ...

    def executed(self, fingerprint: str) -> int:
        """How many calls with this fingerprint already ran (finished) in the run."""
        ...

    def begin(self, key: str) -> bool:
        """Mark the intent `started` and commit; False when someone else already did."""
        ...


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    value: Any = None
    error: str = ""
    detail: str = ""
    duration_ms: int = 0
    # The call may have taken effect before it failed (see ToolError.outcome_unknown).
    unknown: bool = False
    # What the tool's source sent besides `value` (registry.WithContent): journal only.
    content: dict[str, Any] | None = None

    def result(self) -> dict[str, Any]:
        if self.ok:
            if self.content is not None:
                return {"ok": True, "result": self.value, "content": self.content}
            return {"ok": True, "result": self.value}
        return {"ok": False, "error": self.error, "detail": self.detail}


class ToolRunner(Protocol):
    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome: ...


class ThreadRunner:
    """Runs tools on a helper thread and stops waiting at the tool's timeout.

    Python cannot kill a thread: a timed-out tool's thread is abandoned (it is a
    daemon, and exits once its call returns) and its result is dropped; the next call
    gets a fresh thread. Otherwise the thread is reused, since starting one per call
    costs more than a quick tool (about 160 us against 10): by this runner's next call,
    and once the runner is closed by the next runner of the process (`_IDLE`). Exceptions
    become error results.
    """

    def __init__(self) -> None:
        self._worker: _Worker | None = None

    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        started = time.monotonic()
        worker = self._worker if self._worker is not None else _idle_worker()
        # In the caller's context: what the caller set for the tool's call (the MCP
        # gateway's progress listener) reaches it on the helper thread.
        context = contextvars.copy_context()
        future = worker.submit(lambda: context.run(self.call, spec, args, ctx))
        try:
            value = self.wait(future, ctx.timeout)
        except concurrent.futures.TimeoutError:
            worker.abandon()
            self._worker = None
            return ToolOutcome(
                ok=False,
                error="timeout",
                detail=f"{spec.name} did not finish within {ctx.timeout:g} s",
                duration_ms=_ms(started),
            )
        except ToolError as exc:
            self._worker = worker
            return ToolOutcome(
                ok=False,
                error=exc.error,
                detail=exc.detail[:2000],
                duration_ms=_ms(started),
                unknown=exc.outcome_unknown,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is a result
            self._worker = worker
            return ToolOutcome(
                ok=False,
                error=type(exc).__name__,
                detail=str(exc)[:2000],
                duration_ms=_ms(started),
            )
        self._worker = worker
        if isinstance(value, WithContent):
            return ToolOutcome(ok=True, value=value.value, content=value.content, duration_ms=_ms(started))
        return ToolOutcome(ok=True, value=value, duration_ms=_ms(started))

    def wait(self, future: concurrent.futures.Future[Any], timeout: float) -> Any:
        """The tool's value (or its exception); TimeoutError past `timeout` seconds."""
        return future.result(timeout=timeout)

    def call(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> Any:
        return spec.func(args, ctx)

    def close(self) -> None:
        """Give the helper thread back: a driver calls this when it is done with the
        run. The process keeps a few idle for the next runners (a gateway call or a
        worker's drive makes one each) and lets the others end, else every drive would
        leave one idle thread behind in a long-lived worker."""
        if self._worker is not None:
            _park(self._worker)
            self._worker = None


# Idle helper threads of finished runners, for the next ones: at most IDLE_KEPT.
_IDLE: list[_Worker] = []
IDLE_KEPT = 8


def _idle_worker() -> _Worker:
    while True:
        try:
            worker = _IDLE.pop()
        except IndexError:
            return _Worker()
        # A thread of the parent process, or one that ended: the fork left its object
        # behind without its thread (is_alive is False in the child).
        if worker.alive():
            return worker


def _park(worker: _Worker) -> None:
    if len(_IDLE) < IDLE_KEPT and worker.alive():
        _IDLE.append(worker)
    else:
        worker.abandon()


class _Worker:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._abandoned = False
        self._busy = False  # a job submitted and not finished
        self._thread = threading.Thread(target=self._loop, name="airlock-tool", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """Running and idle: fit to take another runner's calls."""
        return not self._abandoned and not self._busy and self._thread.is_alive()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._busy = True
        self._jobs.put((fn, future))
        return future

    def abandon(self) -> None:
        self._abandoned = True
        self._jobs.put(None)

    def _loop(self) -> None:
        while not self._abandoned:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            value: Any = None
            try:
                value = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                self._busy = False  # before the caller wakes: it may give the thread back at once
                future.set_exception(exc)
            else:
                self._busy = False
                future.set_result(value)
            # Drop the finished job before waiting for the next one: the future holds
            # the tool's result (10 MB, say), and an idle thread would keep it alive.
            del job, fn, future, value


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


@dataclass
class Deps:
    model: ModelClient
    registry: Registry
    journal: Journal
    runner: ToolRunner = field(default_factory=ThreadRunner)
    now: Callable[[], float] = time.time
    # The calls before this one, for history rules; None: such rules fail closed.
    history: History | None = None
