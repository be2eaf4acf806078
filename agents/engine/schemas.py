"""JSON Schemas of tool arguments: the one place their validators are built.

A tool's schema may come from an MCP server, so it is hostile input, and validating a
model's arguments against it runs inside a worker. Hence:

1. Nothing is ever retrieved. jsonschema's default (deprecated) registry follows a `$ref`
   to any URL with urllib: a worker would send requests wherever a schema points, read
   `file://` paths into the error a model sees, and wait forever on a server that never
   answers. Every validator here is built with `NO_RETRIEVAL`, a `referencing.Registry`
   that refuses to fetch.
2. `pattern` and `patternProperties` (also as `additionalProperties` reads them) run on
   RE2 (`engine/regex.py`), linear time, instead of Python's backtracking `re`.
3. `schema_problem()` refuses, before a validator exists, what would still hurt: a
   `$ref` that is not a JSON pointer into the schema itself, a `$ref` cycle (validation
   would recurse until the stack runs out), nesting deeper than `MAX_DEPTH`, refs that
   expand past `MAX_EXPANDED` subschemas (a chain of `allOf: [#/x, #/x]` doubles per
   link), a pattern RE2 cannot compile, and patterns `unevaluatedProperties` would run
   on Python's `re`.

`ToolSpec` checks every schema with `check()` and validates with `validator()`; the MCP
sync reports `schema_problem()` as the reason a tool is not offered.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import jsonschema
import referencing
import referencing.exceptions
from jsonschema.exceptions import ValidationError

from . import regex

MAX_DEPTH = 64  # objects and lists inside one another
MAX_EXPANDED = 10_000  # subschemas once every $ref is replaced by its target
MAX_SCHEMA_CHARS = 200_000

REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose value is data (not a schema): refs and patterns inside mean nothing.
DATA_KEYS = frozenset({"enum", "const", "default", "examples"})
# Keywords whose value maps names to subschemas.
MAP_KEYS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class SchemaRefused(ValueError):
    """A schema Airlock will not validate against; the message says why."""


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs-made


# The registry of every validator: it holds nothing and retrieves nothing.
NO_RETRIEVAL: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


# -- the keywords that take patterns, on RE2 ----------------------------------------------


def _pattern(validator: Any, patrn: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        found = regex.search(patrn, instance)
    except regex.RegexError as exc:
        yield ValidationError(f"cannot be checked against the pattern {patrn!r}: {exc}")
        return
    if not found:
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _key_matches(pattern: str, key: str) -> bool:
    try:
        return regex.search(pattern, key)
    except regex.RegexError:
        return False  # unmatched: additionalProperties then decides about the key


def _pattern_properties(
    validator: Any, pattern_properties: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _key_matches(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    # jsonschema's own, with its patternProperties lookup on RE2 (same messages).
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = {
        key for key in instance
        if key not in properties and not any(_key_matches(p, key) for p in patterns)
    }
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            names = ", ".join(repr(extra) for extra in sorted(extras, key=str))
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties},
)


# -- checking a schema before it is used -------------------------------------------------


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def _walk(schema: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]], str | None]:
    """Every subschema by its JSON pointer, every (location, ref), or the first problem.

    Iterative, so a hostile nesting cannot exhaust the stack before it is measured.
    """
    nodes: dict[str, Any] = {}
    refs: list[tuple[str, str]] = []
    keywords: set[str] = set()
    # (value, pointer, depth, what: "schema" | "map" | "patterns" (a patternProperties map))
    stack: list[tuple[Any, str, int, str]] = [(schema, "", 0, "schema")]
    while stack:
        value, at, depth, what = stack.pop()
        if depth > MAX_DEPTH:
            return nodes, refs, f"nests deeper than {MAX_DEPTH} levels (at {at[:120] or '#'}...)"
        if what in ("map", "patterns"):
            for name, sub in value.items():
                if what == "patterns":
                    try:
                        regex.compile(name)
                    except regex.RegexError as exc:
                        return nodes, refs, f"patternProperties {name!r} at {at or '#'}: {exc}"
                stack.append((sub, f"{at}/{_escape(name)}", depth + 1, "schema"))
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                stack.append((item, f"{at}/{i}", depth + 1, "schema"))
            continue
        if not isinstance(value, dict):
            continue
        nodes[at] = value
        for key, sub in value.items():
            keywords.add(key)
            if key in DATA_KEYS:
                continue
            if key in REF_KEYS and isinstance(sub, str):
                refs.append((at, sub))
            elif key == "pattern" and isinstance(sub, str):
                try:
                    regex.compile(sub)
                except regex.RegexError as exc:
                    return nodes, refs, f"pattern {sub!r} at {at or '#'}: {exc}"
            elif key == "$id" and at:
                return nodes, refs, f"an embedded $id (at {at}) is not supported: it changes what refs resolve to"
            elif key in MAP_KEYS and isinstance(sub, dict):
                kind = "patterns" if key == "patternProperties" else "map"
                stack.append((sub, f"{at}/{_escape(key)}", depth + 1, kind))
            elif isinstance(sub, (dict, list)):
                stack.append((sub, f"{at}/{_escape(key)}", depth + 1, "schema"))
    if "unevaluatedProperties" in keywords and "patternProperties" in keywords:
        # jsonschema evaluates those patterns itself, with Python's backtracking `re`.
        return nodes, refs, "unevaluatedProperties together with patternProperties is not supported"
    return nodes, refs, None


def _target(ref: str) -> str | None:
    """The JSON pointer a local ref names ("" for the root), or None if not local."""
    if ref == "#":
        return ""
    if ref.startswith("#/"):
        return unquote(ref[1:])
    return None


def _refs_problem(nodes: dict[str, Any], refs: list[tuple[str, str]]) -> str | None:
    targets: dict[str, list[str]] = {}  # location -> the pointers its refs name
    for at, ref in refs:
        target = _target(ref)
        if target is None:
            return (
                f"$ref {ref!r} (at {at or '#'}) is not local: Airlock fetches nothing, "
                "only refs to a JSON pointer in the same schema (#/...) are followed"
            )
        if target not in nodes:
            return f"$ref {ref!r} (at {at or '#'}) names no subschema of this schema"
        targets.setdefault(at, []).append(target)
    if not targets:
        return None

    def under(pointer: str) -> list[str]:
        # The targets of the refs located in the subschema at `pointer` (itself included).
        return [t for at, ts in targets.items() if at == pointer or at.startswith(pointer + "/") for t in ts]

    sizes: dict[str, int] = {}
    path: list[str] = []

    def size(pointer: str) -> int:
        # Subschemas once expanded: its own plus, for each ref inside, its target's.
        if pointer in path:
            cycle = " -> ".join(f"#{p}" for p in [*path[path.index(pointer):], pointer])
            raise SchemaRefused(f"$ref cycle {cycle}: recursive schemas are not supported")
        if pointer not in sizes:
            if len(path) >= MAX_DEPTH:
                raise SchemaRefused(f"refs chain deeper than {MAX_DEPTH} levels")
            path.append(pointer)
            own = sum(1 for p in nodes if p == pointer or p.startswith(pointer + "/"))
            total = own + sum(size(t) for t in under(pointer))
            path.pop()
            sizes[pointer] = total
        if sizes[pointer] > MAX_EXPANDED:
            raise SchemaRefused(f"its refs expand to more than {MAX_EXPANDED:,} subschemas")
        return sizes[pointer]

    try:
        size("")
    except SchemaRefused as exc:
        return str(exc)
    return None


def schema_problem(schema: Any) -> str | None:
    """Why Airlock will not validate arguments against `schema`, or None."""
    if not isinstance(schema, dict):
        return "the input schema is not an object"
    nodes, refs, problem = _walk(schema)
    if problem is not None:
        return problem
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        return f"the input schema is over {MAX_SCHEMA_CHARS:,} characters"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return _refs_problem(nodes, refs)


@functools.lru_cache(maxsize=4096)
def check(text: str) -> None:
    """SchemaRefused unless the schema (canonical JSON) is usable; each distinct schema
    is checked once per process (a worker builds its MCP tools' specs for every run)."""
    problem = schema_problem(json.loads(text))
    if problem is not None:
        raise SchemaRefused(problem)


@functools.lru_cache(maxsize=4096)
def validator(text: str) -> Any:
    """The validator for a schema (canonical JSON) that passed `check`."""
    check(text)
    return Validator(json.loads(text), registry=NO_RETRIEVAL)


def errors(text: str, instance: Any) -> list[ValidationError]:
    """The instance's validation errors; a ref that still cannot be
    resolved is an error like any other, never a fetch."""
    try:
        found = list(validator(text).iter_errors(instance))
    except referencing.exceptions.Unresolvable as exc:
        return [ValidationError(f"the schema refers to {exc}, which Airlock does not fetch")]
    except RecursionError:
        return [ValidationError("the arguments nest too deeply to be checked")]
    return found
