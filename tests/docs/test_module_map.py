"""docs/how-it-works.md's module map against the tree: every module and package of
`agents/` (and of `config/` and `reviews/`) is named in it, and nothing it names is
missing from the tree, so the map cannot drift from the code again.

How the map is read: inside the fenced block under "## Module map", a line whose first
word ends with `/` opens a folder (nested by indentation: two spaces a level); a word
ending `.py` names a module of the folder open at that point, or, with a `/` in it
(`web/formatting.py`), a module relative to `agents/`; a line at a folder's own indent
plus two, starting with `name.py`, names modules of that folder. The commands folder
names its modules without `.py`, as `manage.py` spells them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "how-it-works.md"
CHECKED = ("agents", "config", "reviews")
COMMANDS = "agents/management/commands"


def map_block(text: str) -> list[str]:
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()[1:]


def named(lines: list[str]) -> tuple[set[str], set[str]]:
    """(folders, modules) the map names, as paths from the project root."""
    folders: set[str] = set()
    modules: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0].rstrip(",")
        if first.endswith("/") and indent <= (stack[-1][0] + 2 if stack else 0):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            # `templates/, static/` and `bench/, scripts/, evals/`: several top folders.
            heads = re.findall(r"([\w/.]+/)(?:,|\s|$)", line[: 20 if indent == 0 else None].split("  ")[0]) or [first]
            for head in heads:
                path = (stack[-1][1] + "/" if stack else "") + head.rstrip("/")
                parts = path.split("/")  # `management/commands/` names both folders
                folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
            stack.append((indent, (stack[-1][1] + "/" if stack else "") + first.rstrip("/")))
            rest = line.split(first, 1)[1]
        else:
            while stack and indent <= stack[-1][0]:
                stack.pop()
            rest = line
        if not stack or stack[0][1] not in CHECKED:
            continue  # tests/, clients/, bench/...: described, not checked
        folder = stack[-1][1]
        for word in re.findall(r"[\w/]+\.py\b", rest):
            if "/" in word:
                modules.add(word if word.split("/")[0] in CHECKED else f"{stack[0][1]}/{word}")
            else:
                modules.add(f"{folder}/{word}")
        if folder == COMMANDS:
            modules.update(f"{COMMANDS}/{w}.py" for w in re.findall(r"\b([a-z_]+)\b", rest))
    return folders, modules


def tree() -> tuple[set[str], set[str]]:
    """(packages, modules) under CHECKED, migrations and `__init__.py` left out."""
    packages: set[str] = set()
    modules: set[str] = set()
    for top in CHECKED:
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            if path.name == "__init__.py":
                packages.add(str(rel.parent))
            else:
                modules.add(str(rel))
    return packages, modules


def test_every_module_and_package_is_on_the_map() -> None:
    folders, modules = named(map_block(DOC.read_text(encoding="utf-8")))
    packages, files = tree()
    assert sorted(packages - folders) == []
    assert sorted(files - modules) == []


def test_the_map_names_nothing_that_does_not_exist() -> None:
    folders, modules = named(map_block(DOC.read_text(encoding="utf-8")))
    assert sorted(f for f in folders if not (ROOT / f).is_dir()) == []
    assert sorted(m for m in modules if not (ROOT / m).is_file()) == []


def test_the_check_sees_a_missing_and_a_phantom_module() -> None:
    lines = map_block(DOC.read_text(encoding="utf-8"))
    folders, modules = named(lines)
    assert "agents/engine/step.py" in modules and "agents/tools/mcp" in folders
    dropped = [line.replace("step.py", "stepper") for line in lines]
    assert "agents/engine/step.py" not in named(dropped)[1]
    planted = [line.replace("limits.py", "limits.py, quotas.py") for line in lines]
    assert "agents/engine/quotas.py" in named(planted)[1]
