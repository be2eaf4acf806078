from __future__ import annotations

import ast
import json
import pathlib

import pytest

from agents.engine import states
from agents.engine.fingerprints import canonical_json, idempotency_key
from agents.engine.limits import LimitError, Limits
from agents.engine.run import RunState, new_run

# The design's table, written out independently of the engine's.
DESIGN_EDGES = {
    ("queued", "planning"),
    ("planning", "done"),
    ("planning", "acting"),
    ("planning", "awaiting_approval"),
    ("planning", "planning"),
    ("acting", "planning"),
    ("acting", "awaiting_approval"),
    ("awaiting_approval", "acting"),
    ("awaiting_approval", "planning"),
} | {(s, end) for s in ("queued", "planning", "acting", "awaiting_approval") for end in ("failed", "cancelled")}


def test_legal_edges_are_exactly_the_designs_table() -> None:
    assert set(states.EDGES) == DESIGN_EDGES
    assert set(states.STATES) == {"queued", "planning", "acting", "awaiting_approval", "done", "failed", "cancelled"}


@pytest.mark.parametrize("edge", [("done", "planning"), ("queued", "acting"), ("acting", "done"), ("failed", "cancelled")])
def test_illegal_transition_raises(edge: tuple[str, str]) -> None:
    with pytest.raises(states.IllegalTransition):
        states.check_edge(*edge)


FORBIDDEN = {"django", "celery", "httpx", "agents"}


def outside_imports(source: str, package: str) -> list[str]:
    """Modules a file of `package` imports from outside agents.engine: absolute imports
    of Django, Celery, httpx or agents.*, relative ones that climb out of the engine
    (`from ..models import Run`), and any import done by a call at run time."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if (node.module or "").split(".")[0] in FORBIDDEN:
                found.append(node.module or "")
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - (node.level - 1)] if node.level - 1 < len(parts) else []
            target = ".".join(base + ([node.module] if node.module else []))
            if not (target == "agents.engine" or target.startswith("agents.engine.")):
                found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("__import__", "import_module"):
                found.append(f"{name}(...)")
    return found


def test_engine_imports_no_django_celery_or_httpx() -> None:
    root = pathlib.Path(states.__file__).parent
    for path in root.rglob("*.py"):
        package = ".".join(["agents", "engine", *path.relative_to(root).parent.parts])
        assert outside_imports(path.read_text(), package) == [], path


@pytest.mark.parametrize(
    "source",
    [
        "from ..models import Run",
        "from .. import store",
        "from ...config import settings",
        "import django.db",
        "from agents.models import Run",
        "from httpx import Client",
        "importlib.import_module('django')",
        "__import__('celery')",
    ],
)
def test_the_purity_check_sees_every_way_out_of_the_engine(source: str) -> None:
    assert outside_imports(source, "agents.engine") != []
    assert outside_imports("from .states import ACTING\nfrom . import policy", "agents.engine") == []


def test_idempotency_key_is_sha256_of_run_step_tool_canonical_args() -> None:
    import hashlib

    key = idempotency_key(7, 3, "echo", {"b": 1, "a": [1, 2]})
    expected = hashlib.sha256(b'7:3:echo:{"a":[1,2],"b":1}').hexdigest()
    assert key == expected
    assert idempotency_key(7, 3, "echo", {"a": [1, 2], "b": 1}) == key
    assert idempotency_key(7, 4, "echo", {"a": [1, 2], "b": 1}) != key
    assert canonical_json({"é": 1}) == '{"é":1}'


def test_state_survives_a_json_round_trip_unchanged() -> None:
    s = new_run("1", limits=Limits(), now=1000.0, task="t", system_prompt="sys")
    s.pending_calls = ["c", "d"]
    s.current_call = {"id": "c", "tool": "echo", "key": "k", "fp": "f"}
    again = RunState.from_json(json.loads(json.dumps(s.engine_json())), json.loads(json.dumps(s.messages)))
    assert again == s


def test_limits_only_tighten() -> None:
    base = Limits.from_dict({"max_steps": 10})
    assert base.tightened({"max_steps": 5}).max_steps == 5
    with pytest.raises(LimitError, match="may only tighten"):
        base.tightened({"max_steps": 11})
    with pytest.raises(LimitError, match="unknown limit"):
        base.tightened({"max_stepz": 1})
    with pytest.raises(LimitError, match="whole number"):
        base.tightened({"max_steps": "3"})
