"""`/mcp/<profile>/` as an ASGI application: the HTTP front (token, profile, session)
and the official SDK's server behind it. `config.asgi` mounts it as it is; the WSGI
door (`bridge.py`) runs it on an event loop thread of its own (docs/gateway.md).

Both eras of the protocol on one URL: a request whose MCP-Protocol-Version is past the
handshake versions (2026-07-28: no session, each request stands alone) goes to the
SDK's stateless path; the rest to the handshake path, where the gateway owns the
session: it mints the `Mcp-Session-Id` at `initialize`, keeps it in the database
(`GatewaySession`) and checks it on every request, and lets the SDK serve each request
on its own (`stateless=True`; the SDK's stateful mode keeps a session in one process's
memory, which another gunicorn worker or host would not find). Either way a call goes
to its caller's stream (core.py): nothing an MCP request needs lives between requests
in a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib.metadata
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import mcp_types as types
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils import timezone
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types import methods as spec_methods
from mcp_types.jsonrpc import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from agents.actions import external
from agents.lib import jsonsafe
from agents.ops.middleware import log_denial
from agents.runs import driver

from . import content, core, holds, relay, tasks

T = TypeVar("T")
# serverInfo.version: the installed distribution's (pyproject.toml's `version`).
try:
    VERSION = importlib.metadata.version("airlock")
except importlib.metadata.PackageNotFoundError:  # a checkout run without `pip install -e .`
    VERSION = "0+unknown"
PATH = re.compile(r"^/mcp/(?P<profile>[A-Za-z0-9_-]{1,64})/?$")
MAX_BODY = 4 * 1024 * 1024
# On every answer, as Django's SecurityMiddleware puts it on the pages': a browser never
# takes the gateway's JSON for something else.
NOSNIFF = (b"x-content-type-options", b"nosniff")
POLL_SECONDS = 0.1
# A waiting call reads its own status when its run moved (the watcher's one query a
# tick says so), and at least this often whatever the watcher saw.
RECHECK_SECONDS = 5.0
# Threads for database work: every handler's queries run there, never on the loop.
# Waiting calls sleep on the loop, not in a thread, so 50 waiting clients hold no thread.
DB_THREADS = anyio.CapacityLimiter(16)


def _released(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        # The thread's connection goes back to the pool between requests' queries.
        driver.release_connection()


async def db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(functools.partial(_released, fn, *args, **kwargs), limiter=DB_THREADS)


@dataclass(frozen=True)
class Gate:
    """What the front learned of a request, for its MCP handlers (in the ASGI scope):
    the caller and where its calls go (`core.Admitted`); with `started`, the front also
    proposed the request's tools/call (`call`: its tool and arguments), in the same trip
    to the database as the token and the session."""

    admitted: core.Admitted
    call: tuple[str, Any] | None = None
    started: Any = None

    @property
    def caller(self) -> core.Caller:
        return self.admitted.caller


def _gate(ctx: Any) -> Gate:
    gate = ctx.request.scope.get("airlock.gateway") if ctx.request is not None else None
    if not isinstance(gate, Gate):
        raise RuntimeError("an MCP request reached the server without the gateway's front")
    return gate


# -- the MCP server -----------------------------------------------------------------------


# The input schemas this process has listed, by profile and listed name (a profile that
# keeps one server's names lists them under the upstream's own): what the SDK checks a
# 2026-07-28 call's `Mcp-Param-*` headers against, without a tools/list of its own (a
# trip to the database) on every call. The SDK asks with the name alone, so the front
# says whose request it is (`_profile`). A tool this process never listed is not
# checked here, as the SDK skips the check when a listing fails; its arguments are
# validated against its schema anyway, by the engine, before anything runs.
_schemas: dict[tuple[int, str], Any] = {}
_profile: contextvars.ContextVar[int | None] = contextvars.ContextVar("airlock_gateway_profile", default=None)


def listed_schema(name: str) -> Any:
    return _schemas.get((_profile.get() or 0, name))


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    gate = _gate(ctx)
    listed = await db(core.tool_list, gate.caller)
    _schemas.update(((gate.caller.profile_id, t["name"]), t["inputSchema"]) for t in listed)
    return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in listed])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    """A tools/call: proposed through the decision API's `call_propose`; a call that
    needs a human waits up to AIRLOCK_GATEWAY_WAIT_SECONDS for the decision (progress
    notifications, if the client asked, each second), then answers as it stands. In the
    2026-07-28 era a call still held answers `input_required` with a sealed
    `requestState` naming it (`holds`), for up to HOLD_ROUNDS rounds, or, to a client
    that takes the tasks extension, a task handle (`tasks`)."""
    gate = _gate(ctx)
    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    held = holds.read(params.request_state, gate.caller) if modern and params.request_state else None
    if held is not None:
        started = await db(core.call_resume, gate.caller, held.run_id, held.key)
    elif gate.call is not None and gate.call == (params.name, params.arguments or {}):
        started = gate.started
    else:
        started = await db(core.call_start, gate.admitted, params.name, params.arguments or {})
    if isinstance(started, core.Reply):
        return _result(started)
    answer, run_id = started
    # A client that takes tasks gets a held call's handle at once, and a running one's
    # when its round's wait is up (tasks.py).
    as_task = modern and tasks.wanted(params.meta)
    if as_task and answer.status == external.PENDING:
        return await db(tasks.create, gate.caller, run_id, answer)
    waited_from = time.time()
    answer = await _wait(ctx, gate, answer, run_id)
    if as_task and core.waiting(answer):
        return await db(tasks.create, gate.caller, run_id, answer)
    if modern and answer.status == external.PENDING:  # held for a human (a running call answers "call again")
        held = held if held is not None else holds.first(run_id, answer.key, since=waited_from)
        if held.again():
            return types.InputRequiredResult(request_state=holds.write(gate.caller, held))
    return _result(core.reply(answer, run_id))


async def _wait(ctx: Any, gate: Gate, answer: Any, run_id: int) -> Any:
    """The call's answer once it stops waiting, or after AIRLOCK_GATEWAY_WAIT_SECONDS."""
    wait = settings.AIRLOCK_GATEWAY_WAIT_SECONDS
    give_up = time.monotonic() + wait
    last_progress = last_check = 0.0
    watch = watcher()
    while core.waiting(answer) and time.monotonic() < give_up:
        now = time.monotonic()
        if now - last_progress >= 1.0:
            last_progress = now
            waited = wait - (give_up - now)
            await ctx.session.report_progress(waited, wait, "waiting for a reviewer's decision in Airlock")
        moved = await watch.moved(run_id, min(1.0, max(0.0, give_up - time.monotonic())))
        if moved or time.monotonic() - last_check >= RECHECK_SECONDS:
            last_check = time.monotonic()
            answer = await db(core.call_progress, gate.caller, run_id, answer)
    return answer


class Watcher:
    """The runs this event loop's waiting calls wait on, checked together: one query a
    tick (`core.run_versions`) for all of them, instead of each call reading its own
    status five times a second. A run whose version moved (a decision, an expiry, a
    result: every change is a transition) wakes its calls, which then read their status.
    A run seen for the first time wakes them too, so a change that landed before the
    watcher's first look is not missed."""

    def __init__(self) -> None:
        self.waiting: dict[int, set[asyncio.Event]] = {}
        self.seen: dict[int, int | None] = {}
        self.asked: dict[int, float] = {}  # when a call last waited on the run
        self._task: asyncio.Task[None] | None = None

    async def moved(self, run_id: int, timeout: float) -> bool:
        event = asyncio.Event()
        self.waiting.setdefault(run_id, set()).add(event)
        self.asked[run_id] = time.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
            return event.is_set()
        finally:
            events = self.waiting.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    # `seen` stays: the call comes back after reading its status, and
                    # must not be woken again for a version it has seen.
                    del self.waiting[run_id]

    async def _watch(self) -> None:
        while self.waiting:
            await anyio.sleep(POLL_SECONDS)
            ids = list(self.waiting)
            if not ids:
                break
            try:
                versions = await db(core.run_versions, ids)
            except Exception:  # noqa: BLE001 - a failed look wakes everyone to check for themselves
                versions = {}
            for run_id in ids:
                version = versions.get(run_id)
                if run_id not in self.seen or self.seen[run_id] != version:
                    self.seen[run_id] = version
                    for event in self.waiting.get(run_id, ()):
                        event.set()
            stale = time.monotonic() - RECHECK_SECONDS
            for run_id in [r for r, at in self.asked.items() if at < stale and r not in self.waiting]:
                del self.asked[run_id]
                self.seen.pop(run_id, None)


_watchers: dict[int, Watcher] = {}


def watcher() -> Watcher:
    """This event loop's watcher (one loop per process in practice, as for `managers`)."""
    loop_id = id(asyncio.get_running_loop())
    found = _watchers.get(loop_id)
    if found is None:
        found = _watchers[loop_id] = Watcher()
    return found


def _result(reply: core.Reply) -> types.CallToolResult:
    return content.call_result(reply.text, reply.is_error, reply.structured, reply.content)


server = Server(
    "airlock-gateway",
    version=VERSION,
    instructions="Airlock polices these tools: a call may be held for a human reviewer. When a result says "
    "pending_approval, call the same tool again with the same arguments later to get its outcome.",
    on_list_tools=list_tools,
    on_call_tool=relay.relayed(call_tool),
    get_tool_input_schema=listed_schema,
)
# A held call's `requestState` (2026-07-28), sealed and checked at the SDK's boundary.
server.middleware.append(holds.boundary())


def _task_method(fn: Callable[[core.Caller, str], dict[str, Any]]) -> Callable[[Any, Any], Any]:
    """A tasks/* method of the extension, for the 2026-07-28 era only (the handshake
    era's tasks were another design, which the gateway does not offer)."""

    async def handler(ctx: Any, params: Any) -> dict[str, Any]:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=ctx.method)
        if not tasks.wanted(params.meta):  # the extension says: each request declares it
            raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY, message="Missing required client capability",
                           data={"requiredCapabilities": {"extensions": {tasks.EXTENSION: {}}}})
        named = ctx.request.headers.get("mcp-name") if ctx.request is not None else None
        if named is not None and named != params.task_id:  # the routing header a balancer may have used
            raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match the request's taskId")
        return await db(fn, _gate(ctx).caller, params.task_id)

    return handler


server.extensions[tasks.EXTENSION] = {}
server.add_request_handler("tasks/get", types.GetTaskRequestParams, _task_method(tasks.get))
server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, _task_method(tasks.cancel))
server.add_request_handler("tasks/update", tasks.UpdateTaskParams, _task_method(tasks.update))


class Managers:
    """The SDK's request handling, stateless: one manager answering JSON (most
    requests: one body, no stream) and one answering SSE (a tools/call that asked for
    progress notifications), started once per event loop."""

    def __init__(self) -> None:
        self.json = StreamableHTTPSessionManager(server, stateless=True, json_response=True)
        self.sse = StreamableHTTPSessionManager(server, stateless=True, json_response=False)
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _serve(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.json.run())
            await stack.enter_async_context(self.sse.run())
            self._ready.set()
            await anyio.sleep_forever()

    async def started(self) -> Managers:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve())
        await self._ready.wait()
        return self


_managers: dict[int, Managers] = {}


async def managers() -> Managers:
    """This event loop's managers (one loop per process in practice: the ASGI server's,
    or the WSGI bridge's thread)."""
    loop = asyncio.get_running_loop()
    found = _managers.get(id(loop))
    if found is None:
        found = _managers[id(loop)] = Managers()
    return await found.started()


# -- the HTTP front -------------------------------------------------------------------------


async def _answer(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    raw = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), NOSNIFF]
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw})


async def _read_body(receive: Any) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise core.Refused(413, "too_large", f"a request body is at most {MAX_BODY:,} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(value: str) -> str | None:
    """`scheme://host[:port]` as browsers send it (lower case, no default port), or
    None for what is not an origin (`null`, a path, another scheme)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or parts.path not in ("", "/") or parts.query or parts.username:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != _DEFAULT_PORTS[scheme] else "")


def origin_refusal(headers: dict[str, str]) -> core.Refused | None:
    """403 for a request from a browser page of another origin than the deployment's
    own (AIRLOCK_BASE_URL) or one of AIRLOCK_GATEWAY_ALLOWED_ORIGINS: the MCP
    specification's guard against DNS rebinding and pages driving an agent through a
    browser. No `Origin` (every non-browser client) is fine."""
    sent = headers.get("origin")
    if sent is None:
        return None
    allowed = {_origin(o) for o in (settings.AIRLOCK_BASE_URL, *settings.AIRLOCK_GATEWAY_ALLOWED_ORIGINS)}
    found = _origin(sent)
    if found is not None and found in allowed:
        return None
    return core.Refused(403, "forbidden_origin", f"Origin {sent[:200]!r} may not use this gateway "
                        "(AIRLOCK_GATEWAY_ALLOWED_ORIGINS)")


def _sdk_takes_call(
    message: Any, scope: dict[str, Any], headers: dict[str, str], *, modern: bool = False
) -> tuple[str, Any] | None:
    """A tools/call that the SDK will hand to `call_tool` as it stands, as (tool,
    arguments): its envelope, its params and the headers the SDK checks first (Accept,
    and Content-Type) pass the SDK's own checks; in the 2026-07-28 era its routing
    headers and per-request envelope too (the SDK's ladder: `classify_inbound_request`
    and the method's params for the envelope's version), and it resumes no held call
    (a `requestState` is the SDK's to check, then `call_tool`'s). Its proposal may then
    ride on the front's trip to the database, a trip and a pool checkout fewer (its
    `Mcp-Param-*` headers are checked there, once the profile is known:
    `_param_headers_pass`); anything else is left to the SDK, which refuses it before
    anything is proposed."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    try:
        request = types.JSONRPCRequest.model_validate(message)
        params = types.CallToolRequestParams.model_validate(request.params)
    except ValidationError:
        return None
    has_json, _sse = check_accept_headers(Request(scope))
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    # A call that asked for progress starts in the SDK's handler, where the client's
    # answer stream is, so the upstream's progress can be relayed (relay.py).
    if not has_json or _wants_progress(message) or content_type != "application/json":
        return None
    if modern:
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        if params.request_state is not None or find_duplicated_routing_header(raw) is not None:
            return None
        route = classify_inbound_request(message, headers=headers)
        if isinstance(route, InboundLadderRejection):
            return None
        try:
            spec_methods.validate_client_request("tools/call", route.protocol_version, request.params)
        except (ValidationError, KeyError):
            return None
    return params.name, params.arguments or {}


def _param_headers_pass(scope: dict[str, Any], call: tuple[str, Any]) -> Callable[[core.Admitted], bool]:
    """Whether a 2026-07-28 call's `Mcp-Param-*` headers pass the SDK's check, asked once
    the caller's profile is known: against the input schema this process listed for
    the tool (`listed_schema`, what the SDK checks them against), or none when it listed
    none (the SDK then skips the check too)."""
    name, arguments = call
    sent = Request(scope).headers

    def check(admitted: core.Admitted) -> bool:
        if not arguments and not any(h.startswith("mcp-param-") for h in sent):
            return True
        schema = _schemas.get((admitted.caller.profile_id, name))
        return schema is None or validate_mcp_param_headers(schema, arguments, sent) is None

    return check


def _wants_progress(message: Any) -> bool:
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and "progressToken" in meta


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The gateway for one HTTP request under `/mcp/<profile>/`.

    1. A foreign `Origin` is 403 (`origin_refusal`); the path names a profile; the
       Host must be one of ALLOWED_HOSTS.
    2. The token and the profile: 401 with `WWW-Authenticate: Bearer`, 404 for a
       profile that is not external, before anything else is read or run.
    3. GET (a standalone stream) is 405: server messages ride each POST's answer.
       DELETE ends a handshake-era session.
    4. In the handshake era `initialize` opens a session (a row; its id goes back in
       `Mcp-Session-Id`) and every other request names one, which must be the
       caller's, open, of this profile; a 2026-07-28 request names no session. Both
       find the caller's stream (its conversation key) or the run `Airlock-Run` pins.
    5. The SDK answers the request; its handlers find the caller and session in the scope.
    """
    if scope["type"] != "http":
        return
    arrived = timezone.now()  # before any wait for a database thread (core.Admitted)
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    match = PATH.match(scope["path"])
    try:
        refused = origin_refusal(headers)
        if refused is not None:
            raise refused
        if match is None:
            raise core.Refused(404, "not_found", "the gateway is at /mcp/<profile>/")
        domain, _port = split_domain_port(headers.get("host", ""))
        if not validate_host(domain, settings.ALLOWED_HOSTS):
            raise core.Refused(400, "bad_host", "the Host header is not one of ALLOWED_HOSTS")
        method, sid, run_header = scope["method"], headers.get("mcp-session-id"), headers.get("airlock-run")
        authorization = headers.get("authorization")
        if method != "POST":
            caller = await db(core.authenticate, authorization, match["profile"])
            if method == "DELETE" and sid:
                await db(core.session_close, caller, sid)
                await _answer(send, 200, {"closed": True})
                return
            if method == "DELETE":
                raise core.Refused(400, "missing_session", "DELETE needs the Mcp-Session-Id header")
            raise core.Refused(405, "method_not_allowed", "no standalone stream: POST or DELETE",
                               {"Allow": "POST, DELETE"})
        body = await _read_body(receive)
        if body is None:
            return
        try:
            message, unparsed = jsonsafe.parse(body), None
        except jsonsafe.JsonError as exc:
            message, unparsed = None, exc.message
        opening = isinstance(message, dict) and message.get("method") == "initialize"
        params = message.get("params") if opening and isinstance(message.get("params"), dict) else {}
        info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else {}
        # An MCP-Protocol-Version past the handshake era is the 2026-07-28 era: no
        # session, each request stands alone (the SDK refuses a version it does not speak).
        version = headers.get("mcp-protocol-version")
        modern = version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        opening = opening and not modern
        calling = isinstance(message, dict) and message.get("method") == "tools/call"
        call_params = message.get("params") if calling and isinstance(message.get("params"), dict) else {}
        meta = call_params.get("_meta")
        conversation = headers.get(core.CONVERSATION_HEADER)
        # One trip to the database threads: the token, the profile, then the session (and
        # a tools/call's proposal, when the SDK will take the call as it stands).
        call = None if opening or unparsed is not None else _sdk_takes_call(message, scope, headers, modern=modern)
        started = None
        if call is not None:
            admitted, started = await db(
                core.admit_and_start, authorization, match["profile"], sid=sid, run_header=run_header,
                tool=call[0], args=call[1], modern=modern, conversation=conversation, meta=meta,
                check=_param_headers_pass(scope, call) if modern else None, arrived=arrived,
            )
            if started is None:  # its Mcp-Param headers are the SDK's to refuse
                call = None
        else:
            admitted = await db(
                core.admit, authorization, match["profile"], sid=sid, run_header=run_header, opening=opening,
                client_name=str(info.get("name", "")), protocol_version=str(params.get("protocolVersion", "")),
                modern=modern, conversation=conversation, meta=meta, arrived=arrived,
            )
        if unparsed is not None:
            await _answer(send, 400, {"jsonrpc": "2.0", "id": None,
                                      "error": {"code": types.PARSE_ERROR, "message": f"Parse error: {unparsed}"}})
            return
    except core.Refused as refused:
        if refused.status in (401, 403):
            # Both doors log it here, as DenialLogMiddleware does Django's refusals.
            log_denial(refused.status, scope["method"], scope["path"], refused.who)
        await _answer(send, refused.status, {"error": refused.error, "detail": refused.detail}, refused.headers)
        return

    inner = dict(scope)
    inner["airlock.gateway"] = Gate(admitted=admitted, call=call, started=started)
    sid = admitted.sid
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    async def stamped(event: dict[str, Any]) -> None:
        if event["type"] == "http.response.start":
            added = [NOSNIFF, (b"mcp-session-id", (sid or "").encode())] if opening and event["status"] < 400 else [NOSNIFF]
            event = {**event, "headers": [*event.get("headers", []), *added]}
        await send(event)

    _profile.set(admitted.caller.profile_id)
    found = await managers()
    chosen = found.sse if _wants_progress(message) else found.json
    await chosen.handle_request(inner, replay, stamped)
