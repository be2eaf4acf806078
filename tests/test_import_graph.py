"""The project's modules import in one direction, with no circle anywhere: imports
inside functions count (a lazy import is a circle with the lights off), `if
TYPE_CHECKING:` blocks do not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agents", "reviews", "config")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST):
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(test):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def imports(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    known = set(sources)
    return {name: imports(src, name, pkg, known) for name, (src, pkg) in sources.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def project_sources() -> dict[str, tuple[str, bool]]:
    sources = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                sources[module_name(path, ROOT)] = (path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return sources


def test_the_project_has_no_import_cycle() -> None:
    assert cycles(graph(project_sources())) == []


def test_the_cycle_check_sees_a_lazy_import_circle() -> None:
    sources = project_sources()
    # The circle the house once had: the outbox woke deliveries through the tasks module,
    # which imports the outbox's deliverer. Planted as a lazy import, it must be seen.
    sources["agents.notifications.events"] = (
        sources["agents.notifications.events"][0] + "\n\ndef _late():\n    from agents import tasks\n",
        False,
    )
    assert ["agents.notifications.delivery", "agents.notifications.events", "agents.tasks"] in [
        [m for m in c if m in {"agents.notifications.delivery", "agents.notifications.events", "agents.tasks"}]
        for c in cycles(graph(sources))
    ]


def test_type_checking_imports_are_no_edge() -> None:
    known = {"a", "b"}
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n"
    assert imports(source, "a", False, known) == set()
    assert imports("def f():\n    import b\n", "a", False, known) == {"b"}


def test_bottom_rooms_import_nothing_above_them() -> None:
    """`agents.broker` is the bottom of the house: it enqueues by task name, so it never
    imports the tasks, the store or the models."""
    edges = graph(project_sources())
    assert {m for m in edges["agents.broker"] if m.startswith(("agents", "reviews"))} == set()
    assert not any(m.startswith("reviews") for name, deps in edges.items() if name.startswith("agents") for m in deps)
