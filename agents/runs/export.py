"""A run as JSON: the run, its transitions and messages, and a script that replays it.

The same document is the timeline's download, `manage.py export_run` and an eval case
for `manage.py run_evals`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.models import Approval, Message, Run, ToolCall

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


def decisions(run: Run) -> list[dict[str, Any]]:
    """The reviewers' answers in order: each approval's decision and, when it took
    several, the votes of its last round (the first is the editor's when it was edited);
    `expired` when nobody answered in time."""
    expired_calls = {
        t.payload.get("call_id") for t in run.transitions.filter(kind="expiry").only("payload")
    }
    return [
        {
            "tool": a.tool,
            "args": a.args,
            "edited_args": a.edited_args,
            "decision": a.decision,
            "note": a.note,
            "status": a.status,
            "required": a.required,
            "votes": [{k: v for k, v in vote.to_dict().items() if k != "at"} for vote in a.current_votes()],
            "expired": a.status == Approval.Status.EXPIRED and a.call_id in expired_calls,
        }
        for a in run.approvals.prefetch_related("votes").order_by("created_at", "pk")
    ]


def tool_results(run: Run) -> list[dict[str, Any]]:
    """Each finished tool call's result, in the order they ran: what an eval's strict
    replay returns instead of running the tool (agents/runs/evals.py)."""
    return [
        {"tool": tool, "args": args, "result": result}
        for tool, args, result in ToolCall.objects.filter(run=run, status__in=("succeeded", "failed"))
        .order_by("step", "pk")
        .values_list("tool", "args", "result")
    ]


def launch_policy(snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """The part of a run's policy snapshot a launch can give again: its launch rules
    and the settings (the profile's own rules come with the profile)."""
    if not snapshot:
        return {}
    rules = [
        {k: v for k, v in r.items() if k not in ("origin", "index")}
        for r in snapshot.get("rules", [])
        if r.get("origin") == "launch"
    ]
    # Only what tightens: a launch may not turn separated duties off.
    keys = ("irreversible_approvals", "separate_duties", "approval_timeout_seconds")
    return {"rules": rules, **{k: snapshot[k] for k in keys if snapshot.get(k) not in (None, False)}}


def export_run(run: Run) -> dict[str, Any]:
    engine = run.engine
    return {
        "format": FORMAT,
        "agent": run.profile.name,
        "task": run.task,
        "approver": run.approver,
        "limits": engine.get("limits", {}),
        "script": replay_script(run),
        "policy": launch_policy(engine.get("policy")),
        "decisions": decisions(run),
        "tools": "replay",
        "tool_results": tool_results(run),
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
        "messages": Message.engine_transcript(run),
    }


def save_eval_case(run: Run, folder: Path) -> Path:
    """Write the run's case (the export, recorded tool results included) as
    `run-<id>.json` in `folder`, replacing an earlier save of the same run; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{run.pk}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(export_run(run), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)  # a reader (run_evals) never sees half a case
    return path
