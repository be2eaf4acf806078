"""A run as JSON: the run, its transitions and messages, and a script that replays it.

The same document is the timeline's download, `manage.py export_run` and an eval case
for `manage.py run_evals`. Archives of many runs (`manage.py export_runs`, `purge_runs
--export-to`) are JSON Lines with a manifest, at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from agents.defaults import PROFILES
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
            "via": a.via,
            "required": a.required,
            "votes": [{k: v for k, v in vote.to_dict().items() if k != "at"} for vote in a.current_votes()],
            "expired": a.status == Approval.Status.EXPIRED and a.call_id in expired_calls,
        }
        for a in run.approvals.prefetch_related("votes").order_by("created_at", "pk")
    ]


def tool_results(run: Run) -> list[dict[str, Any]]:
    """Each finished tool call's result, in the order they ran: what an eval's strict
    replay returns instead of running the tool (agents/management/evals.py)."""
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


# -- archives: `manage.py export_runs` and `purge_runs --export-to` -------------------

ARCHIVE_FORMAT = "airlock-archive/1"
ARCHIVE_FILE = "runs.jsonl"


def archive_line(run: Run) -> dict[str, Any]:
    """One run as an archive keeps it: `Run.to_dict()` with every transition, message,
    approval (with its votes) and journal entry."""
    approvals = []
    for a in run.approvals.select_related("decided_by", "edited_by").prefetch_related("votes").order_by("pk"):
        approvals.append({
            **a.to_dict(),
            "decision": a.decision,
            "idempotency_key": a.idempotency_key,
            "vote_record": [{**r.vote.to_dict(), "round": r.vote.round, "counts": r.counts} for r in a.vote_record()],
        })  # fmt: skip
    return {
        "run": run.to_dict(),
        "transitions": list(
            run.transitions.order_by("seq").values(
                "seq", "from_state", "to_state", "kind", "payload", "cost_micros", "tokens", "duration_ms", "actor",
                "created_at",
            )  # fmt: skip
        ),
        "messages": list(
            run.messages.order_by("index").values("index", "seq", "role", "content", "tool_calls", "tool_call_id", "name", "created_at")
        ),
        "approvals": approvals,
        "journal": list(
            ToolCall.objects.filter(run=run).order_by("pk").values(
                "idempotency_key", "step", "call_id", "tool", "args", "status", "result", "result_truncated",
                "attempts", "created_at", "finished_at", "args_sha256", "result_sha256",
            )  # fmt: skip
        ),
    }


def write_archive(runs: Any, out: Path, **about: Any) -> dict[str, Any]:
    """Write `runs` (a queryset) to `out`/runs.jsonl, one `archive_line` a line, and
    `out`/manifest.json with the counts and each file's sha256. The manifest is written
    last: a directory without one is an export that did not finish."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {"runs": 0, "transitions": 0, "messages": 0, "approvals": 0, "journal": 0}
    digest = hashlib.sha256()
    path = out / ARCHIVE_FILE
    with path.open("wb") as f:
        for run in runs.select_related("profile", "held_by").order_by("pk").iterator(chunk_size=200):
            line = archive_line(run)
            counts["runs"] += 1
            for key in ("transitions", "messages", "approvals", "journal"):
                counts[key] += len(line[key])
            data = (json.dumps(line, cls=DjangoJSONEncoder, ensure_ascii=False, sort_keys=True) + "\n").encode()
            digest.update(data)
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    manifest = {
        "format": ARCHIVE_FORMAT,
        "created_at": timezone.now().isoformat(),
        **{k: v for k, v in about.items() if v is not None},
        "counts": counts,
        "files": {ARCHIVE_FILE: {"sha256": digest.hexdigest(), "bytes": path.stat().st_size, "lines": counts["runs"]}},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, cls=DjangoJSONEncoder) + "\n", encoding="utf-8")
    return manifest


def check_archive(out: Path) -> list[str]:
    """Every way the files in `out` disagree with its manifest; empty when they agree."""
    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"manifest.json: {exc}"]
    problems = []
    for name, meta in manifest.get("files", {}).items():
        try:
            data = (out / name).read_bytes()
        except OSError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            problems.append(f"{name}: sha256 differs from the manifest")
        lines = data.count(b"\n")
        if lines != meta.get("lines"):
            problems.append(f"{name}: {lines} lines, the manifest says {meta.get('lines')}")
    return problems


class CaseRefused(ValueError):
    """A run that cannot make an eval case; the message says why."""


def save_eval_case(run: Run, folder: Path) -> Path:
    """Write the run's case (the export, recorded tool results included) as
    `run-<id>.json` in `folder`, replacing an earlier save of the same run; its path.

    A purged run is refused (its task, decisions and tool results are gone: the case
    would replay nothing). A run of a profile this deployment made (not one every
    installation has, agents/defaults.py) is marked `"requires_profile"`: run_evals
    says so wherever that profile does not exist, instead of a bare unknown agent."""
    if run.purged_at is not None:
        raise CaseRefused(
            f"run {run.pk}'s content was purged on {run.purged_at:%Y-%m-%d}: its task, the model's decisions and "
            "the tool results are gone, so a case would replay nothing"
        )
    case = export_run(run)
    if run.profile.name not in PROFILES:
        case["requires_profile"] = run.profile.name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{run.pk}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)  # a reader (run_evals) never sees half a case
    return path
