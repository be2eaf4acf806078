"""What Airlock makes of an MCP tool: its name, its pinned hash and its kind.

Plain functions on plain data (the definition as the server lists it), so the rules are
tested without a server or a database.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from agents.engine.fingerprints import canonical_json
from agents.engine.registry import RetrySafety, Returns, Risk

# What providers accept as a tool name (OpenAI and Anthropic agree on this much).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NAME_LIMIT = 64
SEPARATOR = "__"
# A server's name is the prefix of its tools' names: short, and never containing the
# separator, so `NAME__tool` always splits one way.
SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
SERVER_NAME_LIMIT = 24

# The MCP specification's defaults for a missing hint.
HINT_DEFAULTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}


def server_name_problem(name: str) -> str | None:
    """Why `name` cannot name a server, or None."""
    if not name or len(name) > SERVER_NAME_LIMIT:
        return f"a server name has 1 to {SERVER_NAME_LIMIT} characters"
    if not SERVER_NAME.match(name) or name.endswith("_"):
        return "a server name uses letters, digits, '-' and single '_' (not at the end), starting with a letter or digit"
    return None


def tool_name(server: str, mcp_name: str, taken: set[str] = frozenset()) -> tuple[str, str]:  # type: ignore[assignment]
    """`server__tool` as the model will see it, and a note when it had to be changed.

    Characters providers refuse become `_`; a name too long (or clashing with one in
    `taken`) is cut and ends with 8 hex digits of the original's sha256, so it stays
    stable across syncs and distinct.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", mcp_name) or "_"
    name = f"{server}{SEPARATOR}{cleaned}"
    if len(name) <= NAME_LIMIT and name not in taken:
        note = "" if cleaned == mcp_name else f"renamed from {mcp_name!r}: only letters, digits, '_' and '-' allowed"
        return name, note
    digest = hashlib.sha256(mcp_name.encode()).hexdigest()[:8]
    name = f"{name[: NAME_LIMIT - 9]}_{digest}"
    why = "over 64 characters" if len(f"{server}{SEPARATOR}{cleaned}") > NAME_LIMIT else "clashes with another tool"
    return name, f"shortened from {mcp_name!r} ({why})"


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    """The pinned part of a listed tool: name, description, input schema, annotations."""
    return {
        "name": tool.get("name", ""),
        "description": tool.get("description") or "",
        "inputSchema": tool.get("inputSchema") or {"type": "object"},
        "annotations": tool.get("annotations") or {},
    }


def definition_sha256(defn: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(definition(defn)).encode()).hexdigest()


@dataclass(frozen=True)
class Kind:
    risk: Risk
    returns: Returns
    retry_safety: RetrySafety


def annotated_kind(annotations: dict[str, Any] | None) -> Kind:
    """The kind a server's annotations (its hints) describe, with the specification's defaults for missing ones.

    read-only -> read; else not destructive -> write; else irreversible. Idempotent ->
    safe to retry. Open world -> external (taints the run). An unannotated tool is
    therefore irreversible, unsafe and external: it always asks a human.
    """
    hints = {**HINT_DEFAULTS, **{k: v for k, v in (annotations or {}).items() if isinstance(v, bool)}}
    if hints["readOnlyHint"]:
        risk: Risk = "read"
    elif not hints["destructiveHint"]:
        risk = "write"
    else:
        risk = "irreversible"
    retry: RetrySafety = "safe" if hints["idempotentHint"] else "unsafe"
    returns: Returns = "external" if hints["openWorldHint"] else "internal"
    return Kind(risk, returns, retry)


def hints_for(risk: str, returns: str, retry_safety: str) -> dict[str, bool]:
    """The four hints that `annotated_kind` reads back as this kind: what the MCP gateway
    tells its clients, so their own confirmation logic sees the kind Airlock applies
    (the operator's overrides included), whatever the server's annotations said."""
    return {
        "readOnlyHint": risk == "read",
        "destructiveHint": risk == "irreversible",
        "idempotentHint": retry_safety == "safe",
        "openWorldHint": returns == "external",
    }
