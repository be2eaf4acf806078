"""The docs' example models are ones a reader can still call (#47, item 6): a recipe
copied on a first day must not name a model its provider has shut down."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Shut down by OpenAI on 2026-12-11 (developers.openai.com/api/docs/deprecations).
RETIRED = ("gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-5-pro", "o3", "o3-pro")
MODEL = re.compile(r"""["'`](?:openai:)?([a-z0-9.\-]+)["'`]""")


def test_no_doc_names_a_retired_model() -> None:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in MODEL.findall(line):
                if name in RETIRED:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {name}")
    assert found == []


def test_the_recipes_say_where_their_model_is_changed() -> None:
    text = (ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    assert "openai:gpt-6.1-sol" in text and "is the framework's choice, not Airlock's" in text
