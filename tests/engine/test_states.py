from __future__ import annotations

import ast
import json
import pathlib

import pytest

from agents.engine import states
from agents.engine.fingerprints import canonical_json, idempotency_key
from agents.engine.limits import LimitError, Limits
from agents.engine.step import RunState, new_run

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


def test_engine_imports_no_django_celery_or_httpx() -> None:
    root = pathlib.Path(states.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"django", "celery", "httpx", "agents"}, f"{path.name} imports {name}"


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
