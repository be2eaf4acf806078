"""A run as JSON: the run, its transitions and messages, and a script that replays it.

The same document is the timeline's download, `manage.py export_run` and an eval case
for `manage.py run_evals`.
"""

from __future__ import annotations

from typing import Any

from agents.models import Run

FORMAT = "airlock-run/1"


def replay_script(run: Run) -> list[dict[str, Any]]:
    """The model's decisions, in order, in the scripted client's format."""
    usages = [
        t.payload.get("usage")
        for t in run.transitions.filter(kind="model").order_by("seq").only("payload")
    ]
    script: list[dict[str, Any]] = []
    for i, m in enumerate(run.messages.filter(role="assistant").order_by("index")):
        item: dict[str, Any]
        if m.tool_calls:
            item = {"calls": [{"id": c["id"], "tool": c["tool"], "args": c["args"]} for c in m.tool_calls]}
        else:
            item = {"final": m.content}
        if i < len(usages) and usages[i]:
            item["usage"] = usages[i]
        script.append(item)
    return script


def export_run(run: Run) -> dict[str, Any]:
    engine = run.engine
    return {
        "format": FORMAT,
        "agent": run.profile.name,
        "task": run.task,
        "approver": run.approver,
        "limits": engine.get("limits", {}),
        "script": replay_script(run),
        "decisions": [
            {"tool": a.tool, "args": a.args, "decision": a.decision, "note": a.note, "status": a.status}
            for a in run.approvals.order_by("created_at", "pk")
        ],
        "expect": {"state": run.state, "answer": run.answer},
        "run": {
            "id": run.pk,
            "state": run.state,
            "steps": run.steps,
            "cost_micros": run.cost_micros,
            "cost_unknown": run.cost_unknown,
            "tokens": run.tokens,
            "tainted": run.tainted,
            "answer": run.answer,
            "error": run.error,
            "created_at": run.created_at.isoformat(),
            "updated_at": run.updated_at.isoformat(),
        },
        "transitions": [
            {
                "seq": t.seq,
                "from_state": t.from_state,
                "to_state": t.to_state,
                "kind": t.kind,
                "payload": t.payload,
                "cost_micros": t.cost_micros,
                "tokens": t.tokens,
                "duration_ms": t.duration_ms,
                "actor": t.actor,
                "created_at": t.created_at.isoformat(),
            }
            for t in run.transitions.order_by("seq")
        ],
        "messages": [m.to_engine() for m in run.messages.order_by("index")],
    }
