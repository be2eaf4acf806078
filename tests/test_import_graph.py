"""The project's modules import in one direction, with no circle anywhere: imports
inside functions count (a lazy import is a circle with the lights off), `if
TYPE_CHECKING:` blocks do not (they never run), and importing `a.b.c` counts as
importing `a` and `a.b` too, because Python runs their `__init__` first.

The direction is the layer order ../shared/design.md draws (LAYERS below, bottom
first); the imports that break it today are listed in DEBTS, each with the move that
will remove it."""

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


def graph(
    sources: dict[str, tuple[str, bool]], debts: frozenset[tuple[str, str]] = frozenset()
) -> dict[str, set[str]]:
    """Who imports whom, counting the packages' `__init__` an import runs: `import a.b.c`
    from `x` is an edge to `a.b.c`, `a.b` and `a` (unless it is `x`'s own package,
    already running). An edge in `debts` is left out, with the `__init__` it runs."""
    known = set(sources)
    edges: dict[str, set[str]] = {}
    for name, (src, pkg) in sources.items():
        found: set[str] = set()
        for target in imports(src, name, pkg, known):
            # `from a.b import c` names `a.b` as well as `a.b.c`: a debt on `a.b.c` covers
            # both (another import from `a.b` still adds `a.b` through its own parents).
            if any(n == name and (t == target or t.startswith(target + ".")) for n, t in debts):
                continue
            parts = target.split(".")
            found.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in known)
        found.discard(name)
        edges[name] = found - _enclosing(name)
    return edges


def _enclosing(name: str) -> set[str]:
    """The packages whose `__init__` already ran when `name` runs: no edge of its own."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


# The layers of ../shared/design.md, bottom first: a module may import its own layer or
# lower ones, never a higher one. A module belongs to the longest prefix listed. The
# roots `agents` and `reviews` (empty `__init__`, run by every import of the package)
# count as the bottom; `config`'s `__init__` loads only the Celery app.
ROOTS = ("agents", "reviews")
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # engine and lib: pure rules, and helpers that import nothing above them (`broker`
    # wakes tasks by name).
    ("engine, lib", (
        "config", "agents.engine", "agents.lib",
        "agents.broker", "agents.demo", "config.settings", "config.env", "config.celery", "config.fsbroker",
    )),
    ("models", ("agents.models",)),
    # a run's life, tools, model clients, the outbox's events, ops, who may do what
    ("runs, tools", (
        "agents.runs", "agents.tools", "agents.llm", "agents.notifications", "agents.ops", "agents.access",
        "agents.defaults",
    )),
    # what people do (agents/actions/); delivery with its Slack and email links (a link
    # decides through the actions); the sweeper, which expires and escalates approvals
    # and lets reviewers' claims lapse through the actions on the clock's behalf; the
    # Celery shells that call the driver, the sweeper and delivery
    ("actions", (
        "agents.actions", "agents.notifications.delivery", "agents.notifications.links", "agents.notifications.slack",
        "agents.runs.sweeper", "agents.tasks",
    )),
    # the doors: pages, sign-in and members (accounts), API, gateway, reviews, commands,
    # admin, the URL and server wiring
    ("api, gateway, web, reviews", (
        "agents.api", "agents.gateway", "agents.web", "agents.accounts", "reviews", "agents.admin", "agents.apps",
        "agents.management", "agents.templatetags",
        "config.urls", "config.asgi", "config.wsgi", "config.gunicorn",
    )),
]

# Known debts: imports that point up (or close a circle), each with the move that will
# remove it. Empty since issue #50's rooms; nothing new belongs here (move the module).
DEBTS: frozenset[tuple[str, str]] = frozenset()


def layer_of(name: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    if name in ROOTS:
        return 0
    best: tuple[int, int] | None = None
    for rank, (_title, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    return best[0] if best else None


def upward(edges: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> list[str]:
    """Every edge from a layer to a higher one, as `importer [layer] -> imported [layer]`."""
    found = []
    for name in sorted(edges):
        low = layer_of(name, layers)
        for target in sorted(edges[name]):
            high = layer_of(target, layers)
            if low is not None and high is not None and high > low:
                found.append(f"{name} [{layers[low][0]}] -> {target} [{layers[high][0]}]")
    return found


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
    assert cycles(graph(project_sources(), DEBTS)) == []


def test_the_project_imports_only_down_the_layers() -> None:
    assert upward(graph(project_sources(), DEBTS)) == []


def test_every_module_has_a_layer() -> None:
    assert [name for name in project_sources() if layer_of(name) is None] == []


def test_the_roots_import_nothing() -> None:
    edges = graph(project_sources())
    assert {root: edges[root] for root in ROOTS} == {root: set() for root in ROOTS}


def test_every_debt_is_still_owed() -> None:
    """A debt paid (the import gone) leaves the list, so the list stays the truth."""
    sources = project_sources()
    known = set(sources)
    owed = {(name, target) for name, (src, pkg) in sources.items() for target in imports(src, name, pkg, known)}
    assert sorted(DEBTS - owed) == []


def test_the_circle_through_a_package_init_is_seen() -> None:
    """The circle the old check could not see, planted back: models.mcp importing only
    tools.mcp.client runs tools/mcp/__init__, which imports the models (the mapping it
    once needed from there now lives in agents/lib/)."""
    sources = project_sources()
    src, pkg = sources["agents.models.mcp"]
    sources["agents.models.mcp"] = (src + "\n\ndef _late():\n    from agents.tools.mcp import client\n", pkg)
    found = cycles(graph(sources, DEBTS))
    assert any({"agents.models.mcp", "agents.tools.mcp", "agents.models"} <= set(c) for c in found), found


def test_an_upward_import_through_a_package_init_fails_the_layers() -> None:
    """A bottom helper kept inside a top package: importing it runs the package's
    `__init__`, which is the top layer, so the import points up even though the helper
    itself is low."""
    layers: list[tuple[str, tuple[str, ...]]] = [
        ("lib", ("app.lib", "app.web.helpers")),
        ("models", ("app.models",)),
        ("web", ("app.web",)),
    ]
    sources = {
        "app": ("", True),
        "app.lib": ("", True),
        "app.models": ("", True),
        "app.models.runs": ("from app.web.helpers import tidy\n", False),
        "app.web": ("from app.web import views\n", True),
        "app.web.views": ("from app.models import runs\n", False),
        "app.web.helpers": ("def tidy(): ...\n", False),
    }
    assert upward(graph(sources), layers) == ["app.models.runs [models] -> app.web [web]"]
    assert cycles(graph(sources)) == [["app.models.runs", "app.web", "app.web.views"]]
    # The same import inside a function counts too.
    sources["app.models.runs"] = ("def late():\n    from app.web.helpers import tidy\n", False)
    assert upward(graph(sources), layers) == ["app.models.runs [models] -> app.web [web]"]


def test_a_planted_upward_import_in_the_project_fails() -> None:
    sources = project_sources()
    # A model client's package reaching up to the pages, through its `__init__`.
    src, pkg = sources["agents.llm"]
    sources["agents.llm"] = (src + "\n\ndef _late():\n    from agents.web import formatting\n", pkg)
    found = upward(graph(sources, DEBTS))
    assert "agents.llm [runs, tools] -> agents.web [api, gateway, web, reviews]" in found


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
