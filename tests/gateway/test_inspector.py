"""The MCP Inspector's CLI against the gateway, as a user runs it: one process, one
connection, per call (`inspector --cli <url> --method tools/call ...`). A held
irreversible call asked for again and again from new processes is one approval, and
after it the upstream runs once (docs/gateway.md, "Streams"). The Inspector and its
Node come from npm, pinned with the conformance suite (`make conformance`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.models import Approval, ClientCall, Run
from tests.gateway.test_conformance import INSTALLED, NODE, installed
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]
INSPECTOR = INSTALLED / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"


def inspector(url: str, token: str, home: Path, *args: str) -> dict[str, Any]:
    """One invocation of the Inspector's CLI; what it printed, as JSON."""
    ran = subprocess.run(
        [str(NODE), str(INSPECTOR), "--cli", url, "--transport", "http", "--header", f"Authorization: Bearer {token}",
         *args],
        capture_output=True, text=True, timeout=120,
        # Its catalog of servers goes to a folder of the test's own, not the user's home.
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "MCP_CATALOG_PATH": str(home / "mcp.json")},
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads(ran.stdout)


def test_the_inspector_cli_gets_a_held_calls_result_after_one_approval_and_one_execution(
    live_server: Any, gw, upstream, token: str, rita: User, wait_seconds, tmp_path: Path
) -> None:
    installed()
    url = f"{live_server.url}/mcp/gw/"
    listed = inspector(url, token, tmp_path, "--method", "tools/list")
    assert "web__delete_record" in {t["name"] for t in listed["tools"]}
    call = ("--method", "tools/call", "--tool-name", "web__delete_record", "--tool-arg", "record_id=delta")
    held = [inspector(url, token, tmp_path, *call) for _ in range(3)]
    assert {h["structuredContent"]["airlock"]["status"] for h in held} == {"pending_approval"}
    approval = Approval.objects.get()
    assert {h["structuredContent"]["airlock"]["approval_id"] for h in held} == {approval.pk}
    assert upstream.calls("delete_record") == []
    approval_decide(approval_id=approval.pk, decision="approve", user=rita)
    done = inspector(url, token, tmp_path, *call)
    assert done["isError"] is False and done["content"][0]["text"] == "deleted delta"
    assert len(upstream.calls("delete_record")) == 1
    assert Run.objects.count() == 1 and ClientCall.objects.filter(tool="web__delete_record").count() == 1
    # Delivered once: the same call once more is a new intent, held for a reviewer again.
    again = inspector(url, token, tmp_path, *call)
    assert again["structuredContent"]["airlock"]["status"] == "pending_approval"
    assert Approval.objects.count() == 2 and len(upstream.calls("delete_record")) == 1
