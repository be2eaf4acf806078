"""Every relative link and #anchor in README.md and docs/*.md points at a file and a
section that exist, with anchors made the way GitHub makes them from headings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.links import BASE, anchors, broken, documents, links, slug


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(BASE)))
def test_every_link_and_anchor_resolves(doc: Path) -> None:
    assert broken(doc) == []


def test_the_documents_are_all_there() -> None:
    names = {p.name for p in documents()}
    assert {"README.md", "how-it-works.md", "mcp.md", "api.md", "notifications.md", "security.md"} <= names
    assert sum(len(links(p)) for p in documents()) > 50, "the link finder finds the links"


@pytest.mark.parametrize(
    "heading, anchor",
    [
        # As GitHub renders such headings (several are headings of these docs).
        ("Outbound requests (what the hostile probe found)", "outbound-requests-what-the-hostile-probe-found"),
        ("The demo's rules", "the-demos-rules"),
        ("Behind a reverse proxy: the client address", "behind-a-reverse-proxy-the-client-address"),
        ("Signatures (Standard Webhooks)", "signatures-standard-webhooks"),
        ("`mcp_sync` and `add_mcp_server`", "mcp_sync-and-add_mcp_server"),
        ("Delivery, retries, dead deliveries", "delivery-retries-dead-deliveries"),
        ("Processes x threads x connections", "processes-x-threads-x-connections"),
        ("Grants -- run-scoped", "grants----run-scoped"),
    ],
)
def test_anchors_are_githubs_slugs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_file_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Same\n\n## Same\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n"
        "[ok](other.md#same-1) [ok too](#doc) ![image](other.md) [site](https://example.com/#x)\n"
        "`[in code](nowhere.md)`\n\n```\n[in a fence](nowhere.md)\n```\n"
        "[gone](missing.md) [no such section](other.md#same-2)\n"
        "[ref]: other.md#nope\n",
        encoding="utf-8",
    )
    assert anchors(tmp_path / "other.md") == {"other", "same", "same-1"}
    problems = broken(doc)
    assert len(problems) == 3, problems
    assert "missing.md: no file" in problems[0]
    assert "other.md#same-2: no section #same-2" in problems[1]
    assert "other.md#nope: no section #nope" in problems[2]
