"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, npm) against
the gateway, fronting an upstream that offers the suite's tools under their own names
(`expose_names`). Every server scenario passes, or is one of those listed in
docs/gateway.md ("Conformance") as not applying to a tools-only gateway, with why.

The suite and the Node 22 it needs are installed by `make conformance` into
.conformance/ (`make test` does it when missing; so does this test). The suite's client
sends no credentials, so the gateway is served here (its ASGI application, under
uvicorn on loopback, as `config.asgi` serves it) behind a shim that adds the caller's
`Authorization: Bearer` header, the one thing the suite cannot say; Host and Origin
reach the gateway as the suite sent them.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from django.contrib.auth.models import User

from agents.actions.tokens import token_create
from agents.gateway.app import application
from agents.models import AgentProfile
from tests.helpers import free_port, listening, requires_postgres, wait_for

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]

BASE = Path(__file__).resolve().parents[2]
INSTALLED = BASE / ".conformance"
NODE = INSTALLED / "node_modules" / ".bin" / "node"
RESULT_FOLDER = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z$")
SUITE = INSTALLED / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

# Scenarios that do not apply to a gateway that offers governed tools and nothing else
# (docs/gateway.md keeps the same list, with the same reasons).
NOT_APPLICABLE = {
    # The gateway offers tools only: no resources, prompts or completions of its own,
    # and it passes none of its upstreams' through.
    **{name: "no resources" for name in (
        "resources-list", "resources-read-text", "resources-read-binary", "resources-templates-read",
        "resources-subscribe", "resources-unsubscribe")},
    **{name: "no prompts" for name in (
        "prompts-list", "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource",
        "prompts-get-with-image")},
    "completion-complete": "no prompts or resource templates to complete",
    # Airlock calls the upstream on a session of its own, shared by the process's calls,
    # often outside the client's request (a worker, a held call): of what the upstream
    # sends while a call runs, only the call's own progress is relayed (relay.py), not
    # its log messages (the session's, not a call's) nor its requests to the client.
    "logging-set-level": "no log messages of its own (declares no logging capability)",
    "tools-call-with-logging": "an upstream's log messages during a call are not relayed",
    "tools-call-sampling": "an upstream's sampling requests are not relayed",
    "tools-call-elicitation": "an upstream's elicitation requests are not relayed",
    "elicitation-sep1034-defaults": "an upstream's elicitation requests are not relayed",
    "elicitation-sep1330-enums": "an upstream's elicitation requests are not relayed",
    # Every answer is one JSON body (SSE only while a call waits with a progress token):
    # there is no stream to resume, and the scenario checks nothing of a JSON answer.
    "server-sse-polling": "no SSE stream to poll or resume: answers are JSON (the scenario checks nothing then)",
}


def installed() -> None:
    """The suite and its Node, installed by the Makefile's own steps when missing."""
    if not (INSTALLED / ".installed").exists():
        subprocess.run(["make", "-s", "conformance"], cwd=BASE, check=True, timeout=600)


@pytest.fixture
def gateway(suite_upstream: str, lena: User, settings: Any) -> Iterator[str]:
    AgentProfile.objects.create(name="conformance", provider="external", tools=["suite__*"], expose_names=True)
    _token, raw = token_create(user=lena)
    port = free_port()
    # The deployment's own origin is where it is served: the suite's "valid localhost
    # Origin" is this one, its "rebinding" origin another.
    settings.AIRLOCK_BASE_URL = f"http://127.0.0.1:{port}"
    bearer = (b"authorization", f"Bearer {raw}".encode())

    async def shim(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, "headers": [*scope["headers"], bearer]}
            await application(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(shim, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="conformance-gateway", daemon=True)
    thread.start()
    try:
        wait_for(lambda: listening(port), timeout=30, what="the gateway under uvicorn")
        yield f"http://127.0.0.1:{port}/mcp/conformance/"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def run_suite(url: str, out: Path) -> dict[str, list[dict[str, Any]]]:
    """Each server scenario's checks, as the suite wrote them (`-o`): all of them
    (`--suite all`: the pending ones too)."""
    ran = subprocess.run([str(NODE), str(SUITE), "server", "--suite", "all", "--url", url, "-o", str(out)],
                         cwd=BASE, timeout=600, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.exists(), f"the suite wrote no results:\n{ran.stdout[-4000:]}"
    found: dict[str, list[dict[str, Any]]] = {}
    for checks in sorted(out.rglob("checks.json")):
        # One folder per scenario: server-<scenario>-<when it ran>.
        named = RESULT_FOLDER.match(checks.parent.name)
        assert named, f"an unexpected result folder: {checks.parent.name}"
        found[named["scenario"]] = json.loads(checks.read_text())
    return found


def verdict(name: str, checks: list[dict[str, Any]]) -> str:
    """A scenario passes when a check of it succeeded and none failed; otherwise it must
    be one that does not apply."""
    failed = [str(c.get("errorMessage") or c.get("name")) for c in checks if c.get("status") == "FAILURE"]
    if not failed and any(c.get("status") == "SUCCESS" for c in checks):
        return "passes"
    if name in NOT_APPLICABLE:
        return "not applicable: " + NOT_APPLICABLE[name]
    return "FAILS: " + ("; ".join(failed) or "no check of it succeeded")


def test_every_server_scenario_passes_or_does_not_apply_to_a_tools_only_gateway(
    gateway: str, tmp_path: Path
) -> None:
    installed()
    started = time.monotonic()
    results = run_suite(gateway, tmp_path / "results")
    took = time.monotonic() - started
    assert len(results) >= 32, sorted(results)  # 0.1.16's server scenarios, all of them
    report = {name: verdict(name, checks) for name, checks in sorted(results.items())}
    print(f"\nconformance ({took:.0f} s):\n" + "\n".join(f"  {name}: {said}" for name, said in report.items()))
    assert not [name for name, said in report.items() if said.startswith("FAILS")], report
    # A listed scenario that passes now is no longer "not applicable": take it off the list.
    assert not [name for name in NOT_APPLICABLE if report.get(name) == "passes"], report
