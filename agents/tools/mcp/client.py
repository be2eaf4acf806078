"""Calls to MCP servers through the official SDK, from synchronous code.

The worker is a synchronous Celery task and the SDK is asyncio. Two ways to reach a server:

- **streamable HTTP, kept open** (`_Pool`): a tools/call goes over a session that stays
  open in this process, one per server, on one event loop thread of the process; the
  caller's thread waits for its answer. Opening a session (initialize) and listing the
  tools cost several round trips a call made on its own would pay every time. A
  session's listing is trusted for `listing_seconds`, then listed again; a
  `list_changed` notification, a reconnect or a definition that no longer matches the
  pin lists at once. A session that failed (or timed out) is dropped, and the next call
  opens a new one.
- **stdio, and every tools/list of a sync**: an operation in a fresh event loop of its
  own (`anyio.run`). A stdio server is a subprocess of that one operation; the SDK's
  `stdio_client` stops it (stdin closed, then SIGTERM, then SIGKILL, every wait bounded
  and shielded from cancellation) before the operation returns, also on a timeout, so
  no server outlives its call.

No Django here: the caller passes plain `Connection` data and a callback for a changed
definition.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import hashlib
import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, ToolListChangedNotification

from agents.engine import schemas
from agents.engine.registry import ToolError, WithContent
from agents.lib import jsonsafe
from agents.lib.mcp_mapping import definition_sha256

from .content import kept as kept_content

IDEMPOTENCY_META_KEY = "airlock/idempotency_key"
# Who hears the server's progress notifications for a call (progress, total, message),
# from the pool's loop thread: set by the MCP gateway around the work of a client's
# request that asked for progress (agents/gateway/relay.py), read by the call in the
# thread that makes it (the tool runner runs a tool in its caller's context).
PROGRESS: contextvars.ContextVar[Callable[[float, float | None, str | None], None] | None] = (
    contextvars.ContextVar("airlock_mcp_progress", default=None)
)
# Attempts for a call whose transport failed, for tools that are safe to repeat.
SAFE_ATTEMPTS = 3
ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")

T = TypeVar("T")


class _Changed(Exception):
    """The server lists a definition other than the pinned one (or none)."""

    def __init__(self, found: dict[str, Any] | None) -> None:
        super().__init__("definition changed")
        self.found = found


class ConfigError(Exception):
    """The server's registration cannot be used as it is (a missing variable, say)."""


@dataclass(frozen=True)
class Connection:
    """How to reach one server; secrets are named here, and read only when connecting."""

    name: str
    transport: str  # stdio | http
    command: str = ""
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # header -> environment variable

    def transport_context(self) -> Any:
        if self.transport == "stdio":
            argv = shlex.split(self.command)
            if not argv:
                raise ConfigError(f"server {self.name} has no command")
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=self._env() or None)
            return stdio_client(params, errlog=_errlog())
        if self.transport == "http":
            return _OwningHttpTransport(self.url, self._http_client(self._headers()))
        raise ConfigError(f"server {self.name} has an unknown transport {self.transport!r}")

    @staticmethod
    def _http_client(headers: dict[str, str]) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))

    def pool_key(self, headers: dict[str, str]) -> tuple[str, ...]:
        """What makes two kept-open sessions interchangeable: the same server, URL and
        header values (hashed: a rotated secret opens a new session, and no secret is
        kept as a key). Never shared across servers, even at one URL."""
        secret = hashlib.sha256(json.dumps(sorted(headers.items())).encode()).hexdigest()
        return (self.name, self.transport, self.url, secret)

    def _env(self) -> dict[str, str]:
        env = {}
        for key, value in self.env.items():
            ref = ENV_REF.match(str(value))
            env[key] = _from_environment(ref.group(1), f"{key} of server {self.name}") if ref else str(value)
        return env

    def _headers(self) -> dict[str, str]:
        return {h: _from_environment(var, f"header {h} of server {self.name}") for h, var in self.headers.items()}


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: the process's real stderr.

    Not `sys.stderr`, which a Celery worker replaces with a logging proxy that has no
    file descriptor for a subprocess to write to.
    """
    global _devnull
    for stream in (sys.__stderr__, sys.stderr):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    if _devnull is None:
        _devnull = open(os.devnull, "w")  # noqa: SIM115 - kept for the process's life
    return _devnull


_devnull: TextIO | None = None


def _from_environment(var: str, what: str) -> str:
    value = os.environ.get(var)
    if value is None:
        raise ConfigError(f"environment variable {var} (for {what}) is not set on this worker")
    return value


class _OwningHttpTransport:
    """`streamable_http_client` with an HTTP client it closes afterwards."""

    def __init__(self, url: str, http: httpx2.AsyncClient) -> None:
        self._url = url
        self._http = http
        self._inner: Any = None

    async def __aenter__(self) -> Any:
        await self._http.__aenter__()
        self._inner = streamable_http_client(self._url, http_client=self._http)
        try:
            return await self._inner.__aenter__()
        except BaseException:
            await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self._inner.__aexit__(*exc)
        finally:
            await self._http.__aexit__(None, None, None)


class _Kept:
    """One open session of the pool, owned by a task of the pool's loop (an anyio
    context must be left by the task that entered it): the task opens the session,
    waits until the session is dropped, then closes it."""

    def __init__(self, key: tuple[str, ...], url: str, headers: dict[str, str]) -> None:
        self.key, self.url, self.headers = key, url, headers
        self.client: Client | None = None
        self.listed: dict[str, dict[str, Any]] | None = None
        self.listed_at = 0.0
        self.opened = asyncio.Event()
        self.dropped = asyncio.Event()
        self.failure: BaseException | None = None

    async def own(self) -> None:
        async def changed(message: Any) -> None:
            if isinstance(message, ToolListChangedNotification):
                self.listed = None  # the next call lists again

        try:
            http = Connection._http_client(self.headers)
            async with http, Client(
                streamable_http_client(self.url, http_client=http), cache=None, message_handler=changed
            ) as client:
                # Output is checked our way after each call (`_output_check`), per call:
                # the SDK's own check would list again and share state between calls.
                client.session.validate_tool_result = _no_check  # type: ignore[method-assign]
                self.client = client
                self.opened.set()
                await self.dropped.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits to open it
            self.failure = exc
        finally:
            self.client = None
            self.dropped.set()
            self.opened.set()

    async def listing(self, seconds: float, *, fresh: bool = False) -> dict[str, dict[str, Any]]:
        if fresh or self.listed is None or time.monotonic() - self.listed_at >= seconds:
            assert self.client is not None
            started = time.monotonic()
            self.listed = {t.get("name"): t for t in await _list(self.client)}  # type: ignore[misc]
            self.listed_at = started
        return self.listed


async def _no_check(name: str, result: Any) -> None:
    return None


class _Pool:
    """This process's open sessions to streamable-HTTP servers, by `Connection.pool_key`,
    on one event loop thread. `session()` runs on that loop; `run()` is how a
    synchronous caller (a worker thread, a gateway database thread, a request thread)
    gets a coroutine run there and waits for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards starting the loop (the threads race for it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._kept: dict[tuple[str, ...], _Kept] = {}
        self._opening: dict[tuple[str, ...], asyncio.Lock] = {}

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or not self._loop.is_running() or self._pid != os.getpid():
                # First use, or a forked child (a gunicorn or Celery worker): the parent's
                # loop thread did not survive the fork, and neither may its sockets be shared.
                fresh = asyncio.new_event_loop()
                started = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(fresh)
                    fresh.call_soon(started.set)
                    fresh.run_forever()

                self._thread = threading.Thread(target=serve, name="airlock-mcp-sessions", daemon=True)
                self._thread.start()
                started.wait()
                self._loop, self._pid = fresh, os.getpid()
                self._kept, self._opening = {}, {}
            return self._loop

    def on_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return asyncio.run_coroutine_threadsafe(_as_coroutine(fn), self.loop()).result()

    async def session(self, conn: Connection, headers: dict[str, str]) -> _Kept:
        """The open session for `conn`, opened if there is none (one opening at a time
        per server: callers racing for a new server's session share the one opened)."""
        key = conn.pool_key(headers)
        kept = self._kept.get(key)
        if kept is not None and kept.client is not None and not kept.dropped.is_set():
            return kept
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            kept = self._kept.get(key)
            if kept is not None and kept.client is not None and not kept.dropped.is_set():
                return kept
            kept = _Kept(key, conn.url, headers)
            asyncio.get_running_loop().create_task(kept.own())
            await kept.opened.wait()
            if kept.client is None:
                raise kept.failure or ConnectionError(f"server {conn.name}: the session did not open")
            self._kept[key] = kept
            return kept

    def drop(self, kept: _Kept) -> None:
        """Close `kept` (its owner task ends the session); the next call opens another."""
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
        kept.dropped.set()

    def close(self) -> None:
        """Close every open session (at exit): each owner sends its DELETE, bounded."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._pid != os.getpid() or not self._kept:
            return

        async def close_all() -> None:
            kept = list(self._kept.values())
            for k in kept:
                self.drop(k)
            with anyio.move_on_after(5):
                for k in kept:
                    await k.opened.wait()
                    while k.client is not None:
                        await anyio.sleep(0.01)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=10)

    def open_count(self) -> int:
        return len(self._kept)


async def _as_coroutine(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


POOL = _Pool()
atexit.register(POOL.close)


def run_sync(fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine function to completion in a fresh event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    # Called from async code (an async view, say): a loop per thread, so use another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn).result()


def _session(conn: Connection) -> Client:
    # No response cache: every list must see what the server says now.
    return Client(conn.transport_context(), cache=None)


async def _list(client: Client) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever is not followed forever
        page = await client.list_tools(cursor=cursor)
        tools.extend(t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def list_tools(conn: Connection, *, timeout: float) -> list[dict[str, Any]]:
    """The server's tools as it lists them (JSON, camelCase as on the wire)."""

    async def go() -> list[dict[str, Any]]:
        with anyio.fail_after(timeout):
            async with _session(conn) as client:
                return await _list(client)

    try:
        return run_sync(go)
    except BaseException as exc:  # noqa: BLE001 - whatever the transport raised, said plainly
        failure = _failure(_root(exc), conn.name, f"server {conn.name} did not list its tools within {timeout:g} s")
        if failure is None:
            raise
        raise failure from None


@dataclass
class Call:
    """One tools/call, as the registry's tool function makes it."""

    conn: Connection
    mcp_name: str
    pinned_sha256: str
    timeout: float
    retry_safe: bool
    on_changed: Callable[[dict[str, Any] | None], None] = lambda definition: None
    # How long a kept-open session's tools/list is trusted (streamable HTTP only).
    listing_seconds: float = 30.0
    # The journal's limit (AIRLOCK_JOURNAL_MAX_CHARS): what of the server's content
    # blocks and structured content is kept to pass through (content.kept).
    content_chars: int = 1_000_000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """The result for the model, or a ToolError naming what went wrong.

        1. Find the tool's definition as the server lists it (a new connection's
           listing, or a kept-open session's recent one); one that differs from the
           pinned definition is reported through `on_changed` and nothing is called.
        2. Call the tool with the idempotency key in the request's `_meta`.
        3. A transport failure is retried (new connection, same key) only when the tool
           is safe to repeat; the whole sequence shares one deadline, `timeout`. A kept
           session the server no longer knows (it restarted: 404) or cannot be reached
           on did not run the call: any tool is tried once more on a new session.
        """
        sent = False
        listener = PROGRESS.get()

        async def heard(progress: float, total: float | None, message: str | None) -> None:
            assert listener is not None
            listener(progress, total, message)

        on_progress = heard if listener is not None else None

        def check(listed: dict[str, dict[str, Any]]) -> dict[str, Any]:
            found = listed.get(self.mcp_name)
            if found is None or definition_sha256(found) != self.pinned_sha256:
                raise _Changed(found)
            return found

        async def attempt() -> Any:
            nonlocal sent
            async with _session(self.conn) as client:
                found = check({t.get("name"): t for t in await _list(client)})  # type: ignore[misc]
                sent = True
                # The SDK would check structured output against the server's (unpinned)
                # outputSchema with Python's backtracking `re`: checked our way instead.
                client.session.validate_tool_result = _output_check(found)  # type: ignore[method-assign]
                return await client.call_tool(
                    self.mcp_name, args, meta={IDEMPOTENCY_META_KEY: idempotency_key}, progress_callback=on_progress
                )

        async def kept_attempt(headers: dict[str, str]) -> Any:
            nonlocal sent
            kept = await POOL.session(self.conn, headers)
            try:
                try:
                    found = check(await kept.listing(self.listing_seconds))
                except _Changed:
                    # A listing kept from before may be what is stale, not the pin.
                    found = check(await kept.listing(self.listing_seconds, fresh=True))
                assert kept.client is not None
                sent = True
                result = await kept.client.call_tool(self.mcp_name, args, meta={IDEMPOTENCY_META_KEY: idempotency_key},
                                                     progress_callback=on_progress)
                if not result.is_error:
                    await _output_check(found)(self.mcp_name, result)
                return result
            except BaseException as exc:
                root = _root(exc)
                if not isinstance(root, (ToolError, _Changed)) and not _answered(root):
                    # Timed out, cancelled, or the transport failed: whatever the session
                    # holds (a half-read answer) is not to be trusted by the next call.
                    POOL.drop(kept)
                if _not_run(root):
                    sent = False
                    raise _Stale() from exc
                raise

        # Decided here, in the caller's thread (`go` runs on the pool's loop when kept).
        kept = self.conn.transport == "http" and not POOL.on_loop_thread()

        async def go() -> Any:
            nonlocal sent
            attempts = SAFE_ATTEMPTS if self.retry_safe else 1
            headers = self.conn._headers() if kept else {}
            with anyio.fail_after(self.timeout):
                i = stale = 0
                while True:
                    sent = False
                    try:
                        return await (kept_attempt(headers) if kept else attempt())
                    except _Stale:
                        stale += 1
                        if stale == 1:
                            continue  # the server never saw it: once more, on a new session
                        i += 1
                        if i == attempts:
                            raise
                    except Exception as exc:  # noqa: BLE001 - sorted below
                        i += 1
                        if i == attempts or not _is_transport(_root(exc)):
                            raise
                    await anyio.sleep(0.2 * 2 ** (i - 1))

        try:
            if kept:
                result = POOL.run(go)
            else:
                result = run_sync(go)
        except BaseException as exc:  # noqa: BLE001 - whatever the transport raised, said plainly
            root = _root(exc)
            if isinstance(root, _Stale):
                root = _root(root.__cause__) if root.__cause__ else root
            if isinstance(root, _Changed):
                # Recorded here, outside the event loop: the callback writes to the database.
                self.on_changed(root.found)
                what = "no longer lists it" if root.found is None else "changed its definition"
                raise ToolError(
                    "definition_changed",
                    f"server {self.conn.name} {what}; the tool is disabled until an operator accepts it",
                ) from None
            failure = _failure(
                root, self.conn.name, f"{self.mcp_name} did not finish within {self.timeout:g} s", sent=sent
            )
            if failure is None:
                raise
            raise failure from None
        if result.is_error:
            raise ToolError("tool_error", content_text(result.content) or "the server reported an error")
        text = content_text(result.content)
        value: Any = text
        if result.structured_content is not None:
            try:
                # Decoded by the SDK, which lets NaN, 1e400 (infinity) and any depth through:
                # a row holding them could not be written (PostgreSQL's jsonb refuses them).
                structured = jsonsafe.validate(result.structured_content)
            except jsonsafe.JsonError as exc:
                raise ToolError("invalid_result", f"server {self.conn.name} returned unusable JSON: {exc.message}") from None
            value = text or structured
        # The model reads the text summary; the journal keeps the blocks as sent too.
        sent = kept_content(result, value, self.content_chars)
        return value if sent is None else WithContent(value, sent)


class _Stale(Exception):
    """A kept session failed in a way that shows the server did not run the call."""


def _answered(exc: BaseException) -> bool:
    """The server answered (an MCP error of its own): the session is fine."""
    return isinstance(exc, MCPError) and not _is_transport(exc) and not _session_gone(exc)


def _session_gone(exc: BaseException) -> bool:
    # The SDK's spelling of a 404 on a session it had: the server no longer knows it.
    return isinstance(exc, MCPError) and exc.error.code == INVALID_REQUEST and exc.error.message == "Session terminated"


def _not_run(exc: BaseException) -> bool:
    """The request cannot have reached a server that runs it: the session is unknown
    there (404, answered before any tool runs), or nothing accepted the connection."""
    return _session_gone(exc) or isinstance(exc, httpx2.ConnectError)


def _output_check(listed: dict[str, Any]) -> Callable[[str, Any], Awaitable[None]]:
    """`ClientSession.validate_tool_result` for one call: the tool's outputSchema as the
    server lists it now, validated as input schemas are (engine/schemas.py: RE2
    patterns, nothing fetched, hostile schemas refused). A refusal is an answer from the
    server, not a transport failure: it is not retried."""
    schema = listed.get("outputSchema")
    # Canonical text: each distinct schema is checked (and its validator built) once per
    # process, not on every call; `schemas.check` refuses one that is not an object too.
    text = json.dumps(schema, sort_keys=True)

    async def check(name: str, result: Any) -> None:
        if schema is None:
            return
        if result.structured_content is None:
            raise ToolError("invalid_output", f"{name} has an output schema but returned no structured content")
        try:
            schemas.check(text)
        except schemas.SchemaRefused as problem:
            raise ToolError("invalid_output", f"the output schema of {name} is refused: {problem}") from None
        found = schemas.errors(text, result.structured_content)
        if found:
            raise ToolError("invalid_output", f"{name} returned structured content its output schema refuses: "
                            f"{found[0].message}")

    return check


def content_text(blocks: list[Any]) -> str:
    """A tool's content blocks as text: text as is, anything else named, not inlined."""
    parts = []
    for block in blocks or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}, {len(getattr(block, 'data', ''))} base64 chars]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    return "\n".join(parts)


def _root(exc: BaseException) -> BaseException:
    """The first real failure inside the task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _failure(root: BaseException, server: str, timeout_detail: str, *, sent: bool = False) -> ToolError | None:
    """The tool error for what an operation raised (None: let it propagate).

    `sent`: the tools/call request had left, so the effect may have happened.
    """
    if isinstance(root, (KeyboardInterrupt, SystemExit)):
        return None
    if isinstance(root, ToolError):
        return root
    if isinstance(root, TimeoutError):
        return ToolError("timeout", timeout_detail, outcome_unknown=sent)
    if isinstance(root, ConfigError):
        return ToolError("mcp_config", str(root))
    if isinstance(root, MCPError) and not _is_transport(root):
        return ToolError("mcp_error", f"server {server} refused the request: {root}")
    return ToolError("mcp_transport_error", f"server {server}: {_describe(root)}", outcome_unknown=sent)


def _is_transport(exc: BaseException) -> bool:
    """A failure of the connection rather than an answer from the server."""
    if isinstance(exc, (ToolError, ConfigError, TimeoutError, _Changed)):
        return False
    if isinstance(exc, MCPError):
        return exc.error.code == CONNECTION_CLOSED
    return True


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
