"""Calls to MCP servers through the official SDK, from synchronous code.

The worker is a synchronous Celery task and the SDK is asyncio: every operation runs in
a fresh event loop of its own (`anyio.run`), on a helper thread when the caller already
has a loop. A stdio server is a subprocess of that one operation; the SDK's
`stdio_client` stops it (stdin closed, then SIGTERM, then SIGKILL, every wait bounded
and shielded from cancellation) before the operation returns, also on a timeout, so no
server outlives its call.

No Django here: the caller passes plain `Connection` data and a callback for a changed
definition.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import shlex
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from agents import jsonsafe
from agents.engine import schemas
from agents.engine.registry import ToolError

from .mapping import definition_sha256

IDEMPOTENCY_META_KEY = "airlock/idempotency_key"
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
            http = httpx2.AsyncClient(headers=self._headers(), timeout=httpx2.Timeout(30.0, read=300.0))
            return _OwningHttpTransport(self.url, http)
        raise ConfigError(f"server {self.name} has an unknown transport {self.transport!r}")

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

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """The result for the model, or a ToolError naming what went wrong.

        1. Connect and list the tools; a definition that differs from the pinned one is
           reported through `on_changed` and nothing is called.
        2. Call the tool with the idempotency key in the request's `_meta`.
        3. A transport failure is retried (new connection, same key) only when the tool
           is safe to repeat; the whole sequence shares one deadline, `timeout`.
        """
        sent = False

        async def attempt() -> Any:
            nonlocal sent
            async with _session(self.conn) as client:
                listed = {t.get("name"): t for t in await _list(client)}
                found = listed.get(self.mcp_name)
                if found is None or definition_sha256(found) != self.pinned_sha256:
                    raise _Changed(found)
                sent = True
                # The SDK would check structured output against the server's (unpinned)
                # outputSchema with Python's backtracking `re`: checked our way instead.
                client.session.validate_tool_result = _output_check(found)  # type: ignore[method-assign]
                return await client.call_tool(
                    self.mcp_name, args, meta={IDEMPOTENCY_META_KEY: idempotency_key}
                )

        async def go() -> Any:
            nonlocal sent
            attempts = SAFE_ATTEMPTS if self.retry_safe else 1
            with anyio.fail_after(self.timeout):
                for i in range(attempts):
                    sent = False
                    try:
                        return await attempt()
                    except Exception as exc:  # noqa: BLE001 - sorted below
                        if i + 1 == attempts or not _is_transport(_root(exc)):
                            raise
                    await anyio.sleep(0.2 * 2**i)
            raise AssertionError("unreachable")

        try:
            result = run_sync(go)
        except BaseException as exc:  # noqa: BLE001 - whatever the transport raised, said plainly
            root = _root(exc)
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
        if text or result.structured_content is None:
            return text
        try:
            # Decoded by the SDK, which lets NaN, 1e400 (infinity) and any depth through:
            # a row holding them could not be written (PostgreSQL's jsonb refuses them).
            return jsonsafe.validate(result.structured_content)
        except jsonsafe.JsonError as exc:
            raise ToolError("invalid_result", f"server {self.conn.name} returned unusable JSON: {exc.message}") from None


def _output_check(listed: dict[str, Any]) -> Callable[[str, Any], Awaitable[None]]:
    """`ClientSession.validate_tool_result` for one call: the tool's outputSchema as the
    server lists it now, validated as input schemas are (engine/schemas.py: RE2
    patterns, nothing fetched, hostile schemas refused). A refusal is an answer from the
    server, not a transport failure: it is not retried."""
    schema = listed.get("outputSchema")

    async def check(name: str, result: Any) -> None:
        if schema is None:
            return
        if result.structured_content is None:
            raise ToolError("invalid_output", f"{name} has an output schema but returned no structured content")
        problem = schemas.schema_problem(schema)
        if problem is not None:
            raise ToolError("invalid_output", f"the output schema of {name} is refused: {problem}")
        found = schemas.errors(json.dumps(schema, sort_keys=True), result.structured_content)
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
