"""PostgreSQL's one-statement commit and the ORM transaction (SQLite's path, and
PostgreSQL's with AIRLOCK_STORE_ONE_STATEMENT off) write the same rows for the same
transitions: the transitions, messages, tool calls, approvals, outbox events, an
external agent's proposals and the run's cache fields."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from agents.actions.approvals import approval_decide
from agents.models import AgentProfile, Approval, ClientCall, Message, OutboxEvent, Run, ToolCall
from tests.helpers import CRM_UPDATE, call, person, requires_postgres, tainted_write

# The write tool runs on its own thread and connection: it must see the committed run.
pytestmark = [pytest.mark.django_db(transaction=True), requires_postgres()]

# A read, an echo, an error the model sees, a write a human approves, the answer.
SCRIPT = [call("echo", text="a"), call("nope"), *tainted_write()]

RUN_FIELDS = (
    "state", "steps", "cost_micros", "cost_unknown", "tokens", "tainted", "answer", "error", "engine", "version",
    "messages_count", "lease_owner", "lease_expires", "claims_without_progress",
)


def written(run: Run) -> dict[str, Any]:
    """Every row the run's transitions wrote, without what differs between two runs by
    design: ids, times, and the run id inside idempotency keys and the engine's JSON."""
    run.refresh_from_db()
    cache = {f: getattr(run, f) for f in RUN_FIELDS}
    cache["engine"] = {k: v for k, v in run.engine.items() if k not in ("run_id", "deadline")}
    cache["finished"] = run.finished_at is not None
    rows = {
        "run": cache,
        "transitions": list(
            run.transitions.order_by("seq").values(
                "seq", "from_state", "to_state", "kind", "payload", "cost_micros", "tokens", "actor"
            )
        ),
        "messages": list(
            Message.objects.filter(run=run)
            .order_by("index")
            .values("index", "seq", "role", "content", "tool_calls", "tool_call_id", "name")
        ),
        "tool_calls": list(
            ToolCall.objects.filter(run=run)
            .order_by("pk")
            .values(
                "idempotency_key", "fingerprint", "step", "call_id", "tool", "args", "status", "result",
                "result_chars", "result_truncated", "attempts",
            )
        ),
        "approvals": list(
            Approval.objects.filter(run=run)
            .order_by("pk")
            .values(
                "kind", "idempotency_key", "call_id", "step", "tool", "args", "risk", "reason", "taint_source",
                "rule", "shadow", "required", "status", "decision", "decided_by__username",
            )
        ),
        "events": list(OutboxEvent.objects.filter(run=run).order_by("pk").values("type", "data", "approval__status")),
        "proposals": list(
            ClientCall.objects.filter(run=run)
            .order_by("pk")
            .values("key", "call_id", "fingerprint", "tool", "args", "client", "verdict", "reason", "rule")
        ),
    }
    for t in rows["transitions"]:
        t["payload"].get("patch", {}).pop("run_id", None)  # the launch's patch carries the id
        t["payload"].get("patch", {}).pop("deadline", None)
    text = json.dumps(rows, sort_keys=True, default=str)
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", "<time>", text)  # a vote's moment
    # Idempotency keys hash the run id: name them by order of appearance instead.
    names: dict[str, str] = {}
    return json.loads(re.sub(r"\b[0-9a-f]{64}\b", lambda m: names.setdefault(m.group(), f"key{len(names)}"), text))


def test_both_commit_paths_write_the_same_rows(settings, launch, drive: Callable[..., Run]) -> None:
    rita = person("rita", "reviewer")
    # A shadow rule that matches the approved write: both paths record what it would do.
    shadow = {"tool": "ledger_write", "then": "deny", "reason": "would stop writes", "mode": "shadow"}
    AgentProfile.objects.filter(name="scripted").update(rules=[shadow])
    results = {}
    for one_statement in (True, False):
        settings.AIRLOCK_STORE_ONE_STATEMENT = one_statement
        run = drive(launch(SCRIPT))
        assert run.state == "awaiting_approval"
        approval = Approval.objects.pending().get(run=run)
        approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="fine")
        run = drive(run)
        assert run.state == "done"
        results[one_statement] = written(run)
    one, orm = results[True], results[False]
    assert len(one["transitions"]) > 8 and one["tool_calls"] and one["approvals"] and one["events"]
    assert [a["shadow"] for a in one["approvals"]] == [[{"rule": 1, "verdict": "deny"}]]
    for table in one:
        assert one[table] == orm[table], table


def test_both_commit_paths_write_the_same_proposals(settings, api) -> None:
    """An external agent's proposal is written by its transition's commit: an allowed
    client tool (then reported), Airlock's own tool (run at once), a denied call."""
    AgentProfile.objects.create(name="ext", provider="external", client_tools=[CRM_UPDATE], tools=["echo", "fail"])
    policy = {"rules": [{"tool": "fail", "then": "deny", "reason": "nobody calls fail"}]}
    results, answers = {}, {}
    for one_statement in (True, False):
        settings.AIRLOCK_STORE_ONE_STATEMENT = one_statement
        lena = api("lena")
        run_id = lena.post("/api/runs", {"agent": "ext", "task": "tidy", "policy": policy}).data["id"]
        crm = lena.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "A", "note": "n"}})
        said = [crm, lena.post(f"/api/runs/{run_id}/calls/{crm.data['key']}/result", {"ok": True, "output": "ok"})]
        said += [lena.post(f"/api/runs/{run_id}/calls", {"tool": t, "args": {"text": "x"}}) for t in ("echo", "fail")]
        assert [a.status_code for a in said] == [200] * 4, [a.data for a in said]
        answers[one_statement] = [{k: v for k, v in a.data.items() if k != "key"} for a in said]
        results[one_statement] = written(Run.objects.get(pk=run_id))
        assert ClientCall.objects.filter(run_id=run_id, created_at__isnull=False).count() == 3
    one, orm = results[True], results[False]
    assert [(p["tool"], p["verdict"], p["client"]) for p in one["proposals"]] == [
        ("crm_update", "allow", True), ("echo", "allow", False), ("fail", "deny", False),
    ]
    assert answers[True] == answers[False]
    for table in one:
        assert one[table] == orm[table], table
