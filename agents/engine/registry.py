"""Tool registry types: what a tool declares next to its schema."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from . import schemas

# A profile's `NAME__*` names every tool of server NAME (the prefix is `NAME__`).
PATTERN = "__*"

Risk = Literal["read", "write", "irreversible"]
Returns = Literal["internal", "external"]
RetrySafety = Literal["safe", "unsafe"]


class ToolError(Exception):
    """A tool's own failure with a name the model sees (`error`) and a `detail`.

    `outcome_unknown`: the request may have reached the side effect before it failed
    (a server died mid-call). An unsafe tool then waits for a human, as after a crash.
    """

    def __init__(self, error: str, detail: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(f"{error}: {detail}")
        self.error = error
        self.detail = detail
        self.outcome_unknown = outcome_unknown


@dataclass(frozen=True)
class WithContent:
    """What a tool may return instead of a plain value: the `value` the model reads
    (a text summary) and the `content` its source sent (an MCP tool's content blocks
    and structured content, as JSON), which the journal keeps beside the value
    (`{"ok": true, "result": value, "content": content}`) for the MCP gateway to pass
    through as it came."""

    value: Any
    content: dict[str, Any]


@dataclass(frozen=True)
class ToolContext:
    run_id: str
    idempotency_key: str
    timeout: float


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the engine sees it.

    `retry_safety` says whether a call whose outcome is unknown (a crash while it ran)
    may run again with the same idempotency key (`safe`) or needs a human (`unsafe`).
    """

    name: str
    description: str
    schema: dict[str, Any]
    risk: Risk
    returns: Returns
    retry_safety: RetrySafety
    func: Callable[[dict[str, Any], ToolContext], Any] = field(compare=False)
    timeout: float = 30.0
    # A client tool (an external profile's `client_tools`): the client runs it and
    # reports the result; Airlock never calls `func` (see `client_tool_specs`).
    client: bool = False

    def __post_init__(self) -> None:
        assert self.risk in ("read", "write", "irreversible"), self.risk
        assert self.returns in ("internal", "external"), self.returns
        assert self.retry_safety in ("safe", "unsafe"), self.retry_safety
        _check_schema(self._schema_key)

    def validate(self, args: Any) -> str | None:
        """A readable reason the arguments are invalid, or None."""
        if isinstance(args, str):
            # What the model sent, so it can see its mistake (the replay sends `{}`).
            return f"arguments must be a JSON object, not this text: {args[:2000]}"
        if not isinstance(args, dict):
            return f"arguments must be a JSON object, not {type(args).__name__}"
        errors = sorted(schemas.errors(self._schema_key, args), key=lambda e: list(e.path))
        if not errors:
            return None
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        return f"{where}: {first.message}"

    @functools.cached_property
    def _schema_key(self) -> str:
        """The schema as canonical JSON, once per spec: the caches' key, and a model's
        every call is validated."""
        return json.dumps(self.schema, sort_keys=True)

    def openapi(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.schema}


def _check_schema(text: str) -> None:
    """schemas.SchemaRefused unless every validator built from the schema is safe to run
    (no retrieval, RE2 patterns, no ref cycles: engine/schemas.py); cached per schema."""
    schemas.check(text)


CLIENT_TOOL_KEYS = ("name", "description", "schema", "risk", "returns", "retry_safety")
CLIENT_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


class ClientToolError(ValueError):
    """An external profile's `client_tools` that do not have the documented shape."""


def _runs_in_client(args: dict[str, Any], ctx: ToolContext) -> Any:
    raise ToolError("client_tool", "this tool runs in the client, which reports its result")


def client_tool_specs(data: Any) -> list[ToolSpec]:
    """An external profile's client tools as specs, or ClientToolError naming the entry
    and what is wrong with it. Each is `{"name", "description", "schema", "risk",
    "returns", "retry_safety"}` with the values ToolSpec takes; names are plain (no
    `__`, which is the MCP servers' namespace) and distinct."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ClientToolError(f"client_tools must be a list of tool objects, not {type(data).__name__}")
    specs: list[ToolSpec] = []
    for i, item in enumerate(data):
        where = f"client_tools[{i}]"
        if not isinstance(item, dict):
            raise ClientToolError(f"{where} must be an object, not {type(item).__name__}")
        missing = [k for k in CLIENT_TOOL_KEYS if k not in item]
        if missing:
            raise ClientToolError(f"{where} lacks {', '.join(missing)}")
        unknown = sorted(set(item) - set(CLIENT_TOOL_KEYS))
        if unknown:
            raise ClientToolError(f"{where} has unknown key(s) {', '.join(unknown)}")
        name = item["name"]
        if not isinstance(name, str) or not CLIENT_TOOL_NAME.match(name) or "__" in name:
            raise ClientToolError(
                f"{where}.name must be letters, digits, _ or - (starting with a letter, no '__'), not {name!r}"
            )
        if any(s.name == name for s in specs):
            raise ClientToolError(f"{where}.name {name!r} is declared twice")
        if not isinstance(item["description"], str):
            raise ClientToolError(f"{where}.description must be text")
        for key, allowed in (
            ("risk", ("read", "write", "irreversible")),
            ("returns", ("internal", "external")),
            ("retry_safety", ("safe", "unsafe")),
        ):
            if item[key] not in allowed:
                raise ClientToolError(f"{where}.{key} must be one of {', '.join(allowed)}, not {item[key]!r}")
        schema = item["schema"]
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ClientToolError(f'{where}.schema must be a JSON Schema object with "type": "object"')
        try:
            spec = ToolSpec(
                name=name, description=item["description"], schema=schema, risk=item["risk"],
                returns=item["returns"], retry_safety=item["retry_safety"], func=_runs_in_client, client=True,
            )
        except schemas.SchemaRefused as exc:  # an invalid or unsafe schema (engine/schemas.py)
            raise ClientToolError(f"{where}.schema is refused: {exc}") from None
        specs.append(spec)
    return specs


def covering(tools: Iterable[str] | None) -> Callable[[str], bool]:
    """A test of whether a tool's name is among `tools`: a name as given, or one of a
    `NAME__*` pattern's (None: every tool)."""
    if tools is None:
        return lambda name: True
    names = set(tools)
    prefixes = tuple(t[:-1] for t in names if t.endswith(PATTERN))
    return lambda name: name in names or (bool(prefixes) and name.startswith(prefixes))


class Registry:
    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ToolSpec) -> None:
        self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def expand(self, names: Iterable[str] | None) -> list[str] | None:
        """Tool names with each `PREFIX__*` replaced by the registered tools it covers.

        A run snapshots the expanded list at launch, so tools added later are not
        offered to it. Plain names are kept as given (an unknown one stays unknown).
        """
        if names is None:
            return None
        expanded: list[str] = []
        for name in names:
            found = list(filter(covering((name,)), sorted(self._specs))) if name.endswith(PATTERN) else [name]
            expanded.extend(n for n in found if n not in expanded)
        return expanded

    def subset(self, names: Iterable[str] | None) -> Registry:
        """Only the named tools (all when names is None)."""
        if names is None:
            return Registry(self._specs.values())
        return Registry(s for n in names if (s := self._specs.get(n)) is not None)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._specs[n] for n in sorted(self._specs))
