"""MCP servers as tool sources: registration, sync and pinning, and the tools they add
to the registry (governed like built-in tools: same policy, journal and approvals).

`mcp_server_add`, `mcp_server_sync` and `mcp_tool_accept` are shared by the commands and
the admin; `specs()` is what `agents.tools.registry()` offers.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import json
import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection as db_connection
from django.db import transaction
from django.utils import timezone

from agents.engine.registry import PATTERN, ToolContext, ToolError, ToolSpec, covering
from agents.engine.schemas import SchemaRefused, schema_problem
from agents.lib import rows
from agents.lib.mcp_mapping import SEPARATOR, Kind, definition, definition_sha256, tool_name
from agents.models import McpServer, McpTool

if TYPE_CHECKING:
    from . import client

log = logging.getLogger("airlock.mcp")

# The worker waits this much longer than a tool's own timeout, so the call can stop its
# server and report the timeout itself instead of being abandoned mid-teardown.
TEARDOWN_GRACE_SECONDS = 10.0


class McpError(Exception):
    """A refused registration or a failed sync, with a readable detail."""


def connection(server: McpServer) -> client.Connection:
    # The SDK takes most of a second to import: only processes that talk to a server pay.
    from . import client

    return client.Connection(
        name=server.name,
        transport=server.transport,
        command=server.command,
        url=server.url,
        env=dict(server.env or {}),
        headers=dict(server.headers or {}),
    )


# -- registering and syncing -----------------------------------------------------------


def mcp_server_add(
    *,
    name: str,
    command: str = "",
    url: str = "",
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> McpServer:
    if bool(command) == bool(url):
        raise McpError("give exactly one of a command (stdio) or a URL (streamable HTTP)")
    if McpServer.objects.filter(name=name).exists():
        raise McpError(f"a server named {name!r} exists already")
    server = McpServer(
        name=name,
        transport="stdio" if command else "http",
        command=command,
        url=url,
        env=env or {},
        headers=headers or {},
        timeout_seconds=timeout,
    )
    try:
        server.full_clean()
    except ValidationError as exc:
        raise McpError("; ".join(exc.messages)) from None
    server.save()
    return server


@dataclass(frozen=True)
class SyncLine:
    name: str
    status: str
    change: str  # new | unchanged | changed | removed | restored
    annotated: Kind
    effective: Kind
    note: str = ""

    def __str__(self) -> str:
        parts = [self.name]
        for label, field in (("risk", "risk"), ("returns", "returns"), ("retry", "retry_safety")):
            value, said = getattr(self.effective, field), getattr(self.annotated, field)
            parts.append(f"{label}={value}" + (f" (override; annotations say {said})" if value != said else ""))
        state = {
            "active": "offered",
            "changed": "DISABLED: definition changed, accept it in the admin",
            "removed": "not offered: the server no longer lists it",
            "invalid": "not offered: invalid input schema",
        }[self.status]
        parts.append(f"[{self.change}; {state}]")
        if self.note:
            parts.append(self.note)
        return "  ".join(parts)


def _line(tool: McpTool, change: str, notes: list[str] | None = None) -> SyncLine:
    notes = [tool.name_note, *(notes or [])]
    if tool.status == "invalid":
        notes.append(f"why: {schema_problem(tool.input_schema)}")
    return SyncLine(tool.name, tool.status, change, tool.annotated(), tool.effective(), "; ".join(n for n in notes if n))


class SyncLines(list[SyncLine]):
    """One line per synced tool, and `notes` on what the limits left out (printed after)."""

    notes: list[str]


def _pinned(defn: dict[str, Any]) -> dict[str, Any]:
    """The definition as Airlock keeps it: the description cut to the limit (the hash
    stays the listed definition's, so a cut is not a change)."""
    limit = settings.AIRLOCK_MCP_MAX_DESCRIPTION_CHARS
    if len(defn["description"]) <= limit:
        return defn
    return {**defn, "description": defn["description"][:limit]}


def _cut_note(defn: dict[str, Any]) -> list[str]:
    limit = settings.AIRLOCK_MCP_MAX_DESCRIPTION_CHARS
    if len(defn["description"]) <= limit:
        return []
    return [f"description cut from {len(defn['description']):,} to {limit:,} characters (AIRLOCK_MCP_MAX_DESCRIPTION_CHARS)"]


def mcp_server_sync(*, server: McpServer) -> list[SyncLine]:
    """List the server's tools and reconcile them with the pinned ones.

    A new tool is pinned as listed; a listed definition that differs from the pinned one
    disables the tool (`changed`) until an operator accepts it; a tool the server no
    longer lists is `removed`. Nothing an operator set (overrides, switches) is touched.

    Limits (settings): only the first `AIRLOCK_MCP_MAX_TOOLS` tools by name are pinned
    (a pinned tool past the limit becomes `removed`), descriptions are cut to
    `AIRLOCK_MCP_MAX_DESCRIPTION_CHARS`; `SyncLines.notes` says what was left out.
    """
    from . import client  # late, as in connection(): the SDK's import cost

    try:
        listed = client.list_tools(connection(server), timeout=server.timeout_seconds)
    except ToolError as exc:
        McpServer.objects.filter(pk=server.pk).update(last_error=exc.detail[:2000])
        raise McpError(exc.detail) from None
    now = timezone.now()
    lines = SyncLines()
    lines.notes = []
    listed = sorted(listed, key=lambda t: str(t.get("name", "")))
    limit = settings.AIRLOCK_MCP_MAX_TOOLS
    over = listed[limit:]
    if over:
        names = ", ".join(str(t.get("name", "")) for t in over[:5]) + (", ..." if len(over) > 5 else "")
        lines.notes.append(
            f"{server.name} lists {len(listed):,} tools: only the first {limit:,} by name are synced "
            f"(AIRLOCK_MCP_MAX_TOOLS); {len(over):,} not offered: {names}"
        )
    with transaction.atomic():
        existing = {t.mcp_name: t for t in server.tools.select_for_update()}
        taken = set(McpTool.objects.values_list("name", flat=True))
        for raw in listed[:limit]:
            defn, sha = _pinned(definition(raw)), definition_sha256(raw)
            tool = existing.pop(defn["name"], None)
            if tool is None:
                name, note = tool_name(server.name, defn["name"], taken)
                taken.add(name)
                tool = McpTool(server=server, mcp_name=defn["name"], name=name, name_note=note)
                _install(tool, defn, sha)
                change = "new"
            elif tool.sha256 == sha:
                change = "restored" if tool.status == "removed" else "unchanged"
                if tool.status in ("changed", "removed"):
                    # The server lists the pinned definition (again): nothing to accept.
                    tool.pending_definition, tool.pending_sha256 = None, ""
                # Checked again: a pin made before a stricter check (issue 34) is refused now.
                tool.status = "invalid" if schema_problem(tool.input_schema) else "active"
                tool.description = _pinned(tool.definition())["description"]
            else:
                change = "changed"
                tool.status, tool.pending_definition, tool.pending_sha256 = "changed", defn, sha
            tool.synced_at = now
            tool.save()
            lines.append(_line(tool, change, _cut_note(definition(raw))))
        beyond = {str(t.get("name", "")) for t in over}
        for tool in existing.values():
            if tool.status != "removed":
                tool.status = "removed"
                tool.save(update_fields=["status"])
            if tool.mcp_name not in beyond:  # those are in the note
                lines.append(_line(tool, "removed"))
        McpServer.objects.filter(pk=server.pk).update(synced_at=now, last_error="")
    return lines


def _install(tool: McpTool, defn: dict[str, Any], sha: str) -> None:
    # `schema_problem` is the engine's own check (nothing fetched, RE2 patterns, no ref
    # cycles): a tool the registry would refuse to build is not offered, and its sync
    # line says why.
    tool.description = defn["description"]
    tool.input_schema = defn["inputSchema"]
    tool.annotations = defn["annotations"]
    tool.sha256 = sha
    tool.status = "invalid" if schema_problem(tool.input_schema) else "active"
    tool.pending_definition, tool.pending_sha256 = None, ""


def mcp_tool_accept(*, tool_id: int) -> McpTool:
    """Pin the changed definition a sync found; the tool is offered again."""
    with transaction.atomic():
        tool = McpTool.objects.select_for_update().get(pk=tool_id)
        if tool.status != "changed" or not tool.pending_definition:
            raise McpError(f"{tool.name} has no changed definition to accept")
        _install(tool, tool.pending_definition, tool.pending_sha256)
        tool.save()
    return tool


def definition_diff(tool: McpTool) -> str:
    """The accepted definition against the one waiting for acceptance, unified diff."""
    if not tool.pending_definition:
        return ""

    def text(defn: dict[str, Any]) -> list[str]:
        return json.dumps(defn, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    diff = difflib.unified_diff(
        text(tool.definition()), text(tool.pending_definition), "accepted", "listed now", lineterm=""
    )
    return "\n".join(diff)


# -- the registry's side ---------------------------------------------------------------


def _changed_under(tool_id: int, pinned: str) -> Any:
    def record(found: dict[str, Any] | None) -> None:
        # Conditional on the pin we called with: an operator who accepted a newer
        # definition meanwhile is not overruled by this stale observation.
        rows = McpTool.objects.filter(pk=tool_id, sha256=pinned, status="active")
        if found is None:
            updated = rows.update(status="removed")
        else:
            updated = rows.update(
                status="changed", pending_definition=_pinned(definition(found)), pending_sha256=definition_sha256(found)
            )
        if updated:
            log.warning("mcp tool %s changed under a run; disabled until accepted", tool_id)

    return record


def _spec(tool: McpTool) -> ToolSpec:
    from . import client  # late, as in connection(): the SDK's import cost

    kind = tool.effective()
    call = client.Call(
        conn=connection(tool.server),
        mcp_name=tool.mcp_name,
        pinned_sha256=tool.sha256,
        timeout=tool.timeout(),
        retry_safe=kind.retry_safety == "safe",
        on_changed=_changed_under(tool.pk, tool.sha256),
        listing_seconds=settings.AIRLOCK_MCP_LISTING_SECONDS,
        content_chars=settings.AIRLOCK_JOURNAL_MAX_CHARS,
    )

    def run(args: dict[str, Any], ctx: ToolContext) -> Any:
        return call(args, ctx.idempotency_key)

    return ToolSpec(
        name=tool.name,
        description=tool.description or tool.mcp_name,
        schema=tool.input_schema,
        risk=kind.risk,
        returns=kind.returns,
        retry_safety=kind.retry_safety,
        func=run,
        timeout=tool.timeout() + TEARDOWN_GRACE_SECONDS,
    )


# McpTool.offered(), in SQL (aliases: `a` the tool, `b0` its server).
_OFFERED = "a.status = 'active' AND a.enabled = %s AND b0.enabled = %s"
# The version of a tool's row and its server's: any change to either changes it. An
# UPDATE never rewrites a row in place; it writes a new version at a new `ctid`, stamped
# with the writing transaction's `xmin`, so the pair names one version of a row (two
# updates in one transaction share the xmin, not the ctid). It costs next to nothing to
# read, where a hash of each row's text (md5(a::text || b0::text), before) cost 11 ms a
# read with 500 tools registered: every gateway call and every drive reads the marks.
_FINGERPRINT = "a.xmin::text || a.ctid::text || ' ' || b0.xmin::text || b0.ctid::text"


def _offered(names: Collection[str] | None) -> tuple[str, list[Any]] | None:
    """The WHERE clause and parameters of the offered tools (only those `names` when
    given: tool names, or a profile's `NAME__*` patterns); None when `names` names no
    MCP tool."""
    if names is None:
        return _OFFERED, [True, True]
    mcp_names = {n for n in names if SEPARATOR in n}  # built-in names have no `__`
    prefixes = sorted({n[:-1] for n in mcp_names if n.endswith(PATTERN)})
    wanted = sorted(n for n in mcp_names if not n.endswith(PATTERN))
    if not wanted and not prefixes:
        return None
    # substr, not LIKE: exact on both databases (SQLite's LIKE ignores case, and `_`
    # in a server's name is a LIKE wildcard), as Registry.expand's startswith is.
    alternatives = [f"a.name IN ({rows.placeholders(wanted)})"] if wanted else []
    alternatives += ["substr(a.name, 1, %s) = %s"] * len(prefixes)
    params = [True, True, *wanted, *(x for prefix in prefixes for x in (len(prefix), prefix))]
    return f"{_OFFERED} AND ({' OR '.join(alternatives)})", params


@functools.lru_cache(maxsize=64)
def _read(where: str, fingerprinted: bool = False) -> rows.Joined:
    annotate = [("fingerprint", _FINGERPRINT)] if fingerprinted else []
    return rows.Joined(McpTool, ["server"], f"{where} ORDER BY a.id", annotate=annotate)


def offered_tools(names: Collection[str] | None = None) -> list[McpTool]:
    """The MCP tools on offer, each with its server: those whose `McpTool.offered()` is
    true, only those `names` when given. Every drive asks, so the query is written out
    (agents/lib/rows.py)."""
    found = _offered(names)
    return [] if found is None else _read(found[0]).fetch(found[1])


# Each offered tool's spec, built once per version of its rows (PostgreSQL): under the
# tool's id and the fingerprint of its row and its server's, so an operator's change to
# either (an override, a new pin, a server's URL or timeout) builds it again. A read
# first asks only for the ids and fingerprints of the offered tools; the rows themselves
# are read and built only when one of them is new. A spec holds no secret (a server's
# headers and environment are read when it calls) and nothing of a request.
_SPECS: dict[tuple[Any, ...], ToolSpec | None] = {}
_SPECS_KEPT = 4096
_UNBUILT: Any = object()


def _marks_from(where: str) -> str:
    qn = db_connection.ops.quote_name
    return (f"FROM {qn(McpTool._meta.db_table)} a JOIN {qn(McpServer._meta.db_table)} b0 ON b0.id = a.server_id"
            f" WHERE {where}")


def marks_column(names: Collection[str] | None) -> tuple[str, list[Any]] | None:
    """The marks `_offered_specs(names)` reads (each offered tool's id and the version of
    its rows), as one column another statement can read them in: a scalar subquery (so
    it runs once, whatever rows the statement has) of `id fingerprint` texts, NULL for
    none, and its parameters; `marks_read` turns its value into the marks
    `read_once` takes. None where a statement cannot carry them (no MCP tool named;
    not PostgreSQL, which alone has row versions)."""
    found = _offered(names)
    if found is None or db_connection.vendor != "postgresql":
        return None
    where, params = found
    return f"(SELECT array_agg(a.id::text || ' ' || {_FINGERPRINT} ORDER BY a.id) {_marks_from(where)})", params


def marks_read(value: list[str] | None) -> list[tuple[int, str]]:
    """The marks of a `marks_column` value."""
    return [(int(pk), mark) for pk, mark in (text.split(" ", 1) for text in value or ())]


def _offered_specs(names: Collection[str] | None = None, marks: list[tuple[int, str]] | None = None) -> list[ToolSpec]:
    """`marks`: the marks of `names` as another statement of this request read them
    (`marks_column`), instead of reading them here."""
    found = _offered(names)
    if found is None:
        return []
    where, params = found
    if db_connection.vendor != "postgresql":
        return _built(_read(where).fetch(params))
    listing = settings.AIRLOCK_MCP_LISTING_SECONDS  # a spec's, so part of its key
    if marks is None:
        marks = rows.fetch(
            f"SELECT a.id, {_FINGERPRINT} {_marks_from(where)} ORDER BY a.id", params,
            # Prepared: planning it cost several times running it (0.75 against 0.12 ms).
            # Its text depends only on how many names and patterns are asked for (the
            # values are parameters), so a process keeps a few shapes.
            prepared=True,
        )
    kept = [_SPECS.get((pk, mark, listing), _UNBUILT) for pk, mark in marks]
    if any(spec is _UNBUILT for spec in kept):
        if len(_SPECS) > _SPECS_KEPT:
            _SPECS.clear()
        # Read again with each row's fingerprint, so a row changed since the marks is
        # kept under its own; the specs are those of this read.
        kept = []
        for tool in _read(where, fingerprinted=True).fetch(params):
            key = (tool.pk, tool.fingerprint, listing)
            spec = _SPECS.get(key, _UNBUILT)
            if spec is _UNBUILT:
                built = _built([tool])  # a refused tool is kept as None: logged once a version
                spec = _SPECS[key] = built[0] if built else None
            kept.append(spec)
    return [spec for spec in kept if isinstance(spec, ToolSpec)]


@dataclass(frozen=True)
class _Once:
    """One `read_once()` scope's read."""

    specs: list[ToolSpec]
    tools: tuple[str, ...] | None  # what the scope read (names and patterns); None: every offered tool


# The specs of the offered MCP tools, read once for the scope of `read_once()`.
_ONCE: contextvars.ContextVar[_Once | None] = contextvars.ContextVar("airlock_mcp_once", default=None)


@contextlib.contextmanager
def read_once(tools: Collection[str] | None = None, marks: list[tuple[int, str]] | None = None) -> Iterator[None]:
    """Within: every `specs()` (the gateway's offered-tools check, the policy's registry,
    the drive that runs the call) answers from one read of the offered MCP tools. A
    gateway call asked three times, a query and a spec build each; one read also means
    the check, the verdict and the execution judge the same pinned rows. Scopes are
    per thread of work (a context variable), never across requests: a definition
    disabled meanwhile is seen by the next call.

    `tools`: the names and `NAME__*` patterns the scope's work asks about (a profile's
    tools), so a gateway call reads its profile's rows, not every server's; None reads
    every offered tool. Within a scope `specs()` is the scope's tools, and a name
    outside them is read on its own. `marks`: those of `tools`, read already by this
    request's own statement (`marks_column`): the scope reads none then."""
    if _ONCE.get() is not None:
        yield  # an outer scope reads for us
        return
    scope = None if tools is None else tuple(tools)
    token = _ONCE.set(_Once(_offered_specs(scope, marks), scope))
    try:
        yield
    finally:
        _ONCE.reset(token)


def specs(names: Collection[str] | None = None) -> list[ToolSpec]:
    """The ToolSpecs of the `offered_tools(names)`: a run builds only the tools its
    profile offers, not every tool of every server."""
    once = _ONCE.get()
    if once is not None:
        if names is None:
            return once.specs
        inside = covering(once.tools)
        if all(inside(n) for n in names if SEPARATOR in n):
            among = covering(names)
            return [s for s in once.specs if among(s.name)]
    return _offered_specs(names)


def _built(tools: list[McpTool]) -> list[ToolSpec]:
    found = []
    for tool in tools:
        try:
            found.append(_spec(tool))
        except SchemaRefused as exc:
            # Pinned before the check refused such schemas; its next sync marks it invalid.
            log.warning("mcp tool %s left out of the registry: its input schema is refused: %s", tool.name, exc)
        except Exception:  # noqa: BLE001 - one bad row must not take the registry down
            log.exception("mcp tool %s left out of the registry", tool.name)
    return found
