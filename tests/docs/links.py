"""Relative links and #anchors in the project's Markdown, resolved the way GitHub renders
them (shared by tests/docs/test_links.py and anyone who wants to check by hand:
`python -m tests.docs.links`)."""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

BASE = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title") and ![alt](target); the text may hold `code` and nested [..].
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ANCHOR = re.compile(r"""<a\s+[^>]*(?:name|id)=["']([^"']+)["']""", re.I)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def documents() -> list[Path]:
    return [BASE / "README.md", *sorted((BASE / "docs").glob("*.md"))]


def prose(path: Path) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than
    `-` and `_` removed, each space a `-`."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("*", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the rendered page has: headings (a repeated one gets -1, -2, ...)
    and explicit <a name|id>."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose(path):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image in the file's prose; inline code spans are
    not links."""
    out = []
    for number, line in prose(path):
        text = CODE_SPAN.sub("", line)
        out.extend((number, target) for target in INLINE.findall(text))
        ref = REFERENCE.match(text)
        if ref:
            out.append((number, ref.group(1)))
    return out


def _shown(path: Path) -> str:
    return str(path.relative_to(BASE)) if path.is_relative_to(BASE) else str(path)


def broken(path: Path) -> list[str]:
    """What does not resolve: a missing file (relative to the document) or a missing
    #anchor in the file it points at. Links with a scheme or to a site are not ours."""
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue
        where, _, anchor = target.partition("#")
        file = (path.parent / unquote(where)).resolve() if where else path
        name = f"{_shown(path)}:{number}: {target}"
        if not file.exists():
            problems.append(f"{name}: no file {_shown(file)}")
        elif anchor and file.suffix == ".md" and unquote(anchor).lower() not in anchors(file):
            problems.append(f"{name}: no section #{anchor} in {_shown(file)}")
        elif anchor and file.suffix != ".md":
            problems.append(f"{name}: an anchor into a file that is not Markdown")
    return problems


if __name__ == "__main__":
    found = [problem for doc in documents() for problem in broken(doc)]
    print("\n".join(found) or "all links resolve")
    sys.exit(1 if found else 0)
