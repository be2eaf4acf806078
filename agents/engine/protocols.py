"""What the engine needs from the outside: a model, a journal, a tool runner, a clock."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .registry import Registry, ToolContext, ToolSpec


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class ProposedCall:
    """A call as the model proposed it; `args` may be anything the model sent."""

    id: str
    tool: str
    args: Any


@dataclass(frozen=True)
class Decision:
    """One model reply: a final answer, or one or more calls (with optional text)."""

    final: str | None = None
    calls: tuple[ProposedCall, ...] = ()
    text: str = ""
    usage: Usage | None = None

    def __post_init__(self) -> None:
        if (self.final is None) == (not self.calls):
            raise ValueError("a decision is either a final answer or at least one call")


class ModelError(Exception):
    """The model could not give a decision (after the client's own retries)."""


@dataclass(frozen=True)
class ModelRequest:
    run_id: str
    turn: int  # how many model calls the run made before this one
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]


class ModelClient(Protocol):
    def decide(self, request: ModelRequest) -> Decision: ...


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

    def result(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "result": self.value}
        return {"ok": False, "error": self.error, "detail": self.detail}


class ToolRunner(Protocol):
    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome: ...


class ThreadRunner:
    """Runs a tool in a thread and stops waiting at its timeout.

    Python cannot kill a thread: a timed-out tool is abandoned (daemon thread) and its
    result, if it ever comes, is dropped. Exceptions become error results.
    """

    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        started = time.monotonic()
        box: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def target() -> None:
            try:
                box.set_result(self.call(spec, args, ctx))
            except BaseException as exc:  # noqa: BLE001 - every failure is a result
                box.set_exception(exc)

        threading.Thread(target=target, name=f"tool-{spec.name}", daemon=True).start()
        try:
            value = box.result(timeout=ctx.timeout)
        except concurrent.futures.TimeoutError:
            return ToolOutcome(
                ok=False,
                error="timeout",
                detail=f"{spec.name} did not finish within {ctx.timeout:g} s",
                duration_ms=_ms(started),
            )
        except Exception as exc:  # noqa: BLE001
            return ToolOutcome(
                ok=False,
                error=type(exc).__name__,
                detail=str(exc)[:2000],
                duration_ms=_ms(started),
            )
        return ToolOutcome(ok=True, value=value, duration_ms=_ms(started))

    def call(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> Any:
        return spec.func(args, ctx)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


@dataclass
class Deps:
    model: ModelClient
    registry: Registry
    journal: Journal
    runner: ToolRunner = field(default_factory=ThreadRunner)
    now: Callable[[], float] = time.time
