"""An MCP tool's review card says which server the tool comes from, shows the server's
description of it (as inert text) and says when an operator's override set its risk."""

from __future__ import annotations

import re

import pytest

from agents.models import Approval, McpTool
from tests.helpers import call, client_for, final, person

pytestmark = pytest.mark.django_db(transaction=True)


def card_html(approval: Approval) -> str:
    page = client_for(person("rita", "reviewer")).get("/reviews/").content.decode()
    match = re.search(rf'<article[^>]*data-approval-id="{approval.pk}".*?</article>', page, re.S)
    assert match, f"no card for approval {approval.pk}"
    return match.group(0)


def test_the_card_names_the_server_and_shows_its_description(stdio_server, mcp_launch, drive) -> None:
    McpTool.objects.filter(name="files__mystery").update(description="Does <b>something</b>; says nothing.")
    run = drive(mcp_launch(stdio_server, [call("files__mystery", value=1), final()]))
    html = card_html(Approval.objects.get(run=run, status="pending"))
    assert (
        '<p class="tool-source">From MCP server <code class="server">files</code>. The server describes it: '
        '<q class="tool-description">Does &lt;b&gt;something&lt;/b&gt;; says nothing.</q></p>'
    ) in html
    assert "override" not in html
    assert 'title="risk declared by the tool">irreversible</span>' in html


def test_the_card_says_an_operators_override_set_the_risk(stdio_server, mcp_launch, drive) -> None:
    McpTool.objects.filter(name="files__add_tag").update(risk_override="irreversible")
    run = drive(mcp_launch(stdio_server, [call("files__add_tag", record_id="alpha", tag="seen"), final()]))
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.risk == "irreversible"
    html = card_html(approval)
    assert (
        "<strong class=\"risk-override\">Risk irreversible was set by an operator's override</strong> (the server's "
        "annotations say write)."
    ) in html.replace("&#x27;", "'")
    assert 'title="risk set by an operator\'s override">irreversible</span>' in html


def test_a_built_in_tools_card_names_no_server(pending) -> None:
    html = card_html(pending())
    assert "tool-source" not in html
