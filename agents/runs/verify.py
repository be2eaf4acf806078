"""Replaying a run's transitions must reproduce its cached state exactly."""

from __future__ import annotations

import json
from typing import Any

from agents.engine import patch
from agents.engine.run import RunState
from agents.models import Approval, Message, Run, ToolCall, Transition


def verify_run(run: Run) -> list[str]:
    """Every way the run's rows disagree with its cache; empty when they agree."""
    if run.purged_at is not None:
        return verify_tombstone(run)
    problems: list[str] = []
    engine: dict[str, Any] = {}
    cost = tokens = 0
    previous = ""
    seqs = []
    for t in run.transitions.order_by("seq").only(
        "seq", "kind", "from_state", "to_state", "payload", "cost_micros", "tokens"
    ).iterator():
        if t.seq == 1 and run.fork_seq is not None:
            # A fork starts from its parent's counters at the fork point: its own
            # transitions add to them (the copied steps were billed to the parent).
            problems.extend(verify_fork_start(run, t))
            cost, tokens = inherited(t.payload)
        seqs.append(t.seq)
        if t.from_state != previous:
            problems.append(f"seq {t.seq}: from {t.from_state!r} but the previous transition ended in {previous!r}")
        previous = t.to_state
        engine = patch.apply(engine, t.payload.get("patch", {}))
        if engine.get("state") != t.to_state:
            problems.append(f"seq {t.seq}: patched state {engine.get('state')!r} != to_state {t.to_state!r}")
        cost += t.cost_micros
        tokens += t.tokens
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"seq is not contiguous from 1: {_gaps(seqs)}")
    if run.version != len(seqs):
        problems.append(f"version {run.version} != {len(seqs)} transitions")
    if engine != run.engine:
        keys = sorted(k for k in engine.keys() | run.engine.keys() if engine.get(k) != run.engine.get(k))
        problems.append(f"replayed engine state differs from the cache in: {', '.join(keys)}")
    replayed = RunState.from_json(engine)
    for name in ("state", "steps", "cost_micros", "cost_unknown", "tokens", "tainted", "answer", "error"):
        if getattr(replayed, name) != getattr(run, name):
            problems.append(f"{name}: replay gives {getattr(replayed, name)!r}, cached {getattr(run, name)!r}")
    if cost != run.cost_micros:
        problems.append(f"transition costs sum to {cost}, cached {run.cost_micros}")
    if tokens != run.tokens:
        problems.append(f"transition tokens sum to {tokens}, cached {run.tokens}")
    indexes = list(Message.objects.filter(run=run).order_by("index").values_list("index", flat=True))
    if indexes != list(range(len(indexes))) or len(indexes) != run.messages_count:
        problems.append(f"messages: {len(indexes)} rows, cached count {run.messages_count}")
    return problems


# What a fork's first state takes from its parent unchanged (the rest is set at the fork:
# limits, deadline, the profile's policy and tools, no grants, queued).
FORK_CARRIED = (
    "steps", "model_calls", "cost_micros", "cost_unknown", "tokens", "consecutive_errors", "tainted",
    "taint_source", "error_streak", "pending_calls", "folded_before", "token_scale",
)


def verify_fork_start(run: Run, first: Transition) -> list[str]:
    """A fork's first transition against its parent: the same counters, taint and
    transcript as the parent's replayed state at the fork point. A parent since purged or
    deleted can no longer be compared; the fork's own replay is still checked."""
    if first.kind != "fork":
        return [f"seq 1 is {first.kind!r}, but the run is a fork of run {run.forked_from_id}"]
    start = first.payload.get("patch", {})
    if inherited(first.payload) != (start.get("cost_micros", 0), start.get("tokens", 0)):
        return [f"seq 1 inherits {inherited(first.payload)} (cost, tokens), its state starts at "
                f"{(start.get('cost_micros', 0), start.get('tokens', 0))}"]
    fork = start.get("fork") or {}
    if fork.get("seq") != run.fork_seq or fork.get("run") != (run.forked_from_id or fork.get("run")):
        return [f"seq 1 names fork point {fork.get('run')}@{fork.get('seq')}, the run row {run.forked_from_id}@{run.fork_seq}"]
    parent = run.forked_from
    if parent is None or parent.purged_at is not None:
        return []
    problems: list[str] = []
    engine: dict[str, Any] = {}
    for payload in parent.transitions.filter(seq__lte=run.fork_seq).order_by("seq").values_list("payload", flat=True):
        engine = patch.apply(engine, payload.get("patch", {}))
    for name in FORK_CARRIED:
        if engine.get(name) != start.get(name):
            problems.append(f"fork start: {name} {start.get(name)!r}, the parent had {engine.get(name)!r} at seq {run.fork_seq}")
    fields = ("role", "content", "tool_calls", "tool_call_id", "name")
    theirs = list(Message.objects.filter(run=parent, seq__lte=run.fork_seq).order_by("index").values_list(*fields))
    mine = list(Message.objects.filter(run=run, seq=1).order_by("index").values_list(*fields))
    # The system prompt and the task may be replaced at the fork: compare the rest.
    same = len(mine) == len(theirs) and all(
        a == b or (a[0] == b[0] and a[0] in ("system", "user") and i == first_of(theirs, a[0]))
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True))
    )
    if not same:
        problems.append(f"fork start: the copied transcript differs from run {parent.pk}'s up to seq {run.fork_seq}")
    return problems


def inherited(payload: dict[str, Any]) -> tuple[int, int]:
    """The cost and tokens a fork's first transition says it took over from its parent."""
    return int(payload.get("inherited_cost_micros", 0)), int(payload.get("inherited_tokens", 0))


def first_of(messages: list[Any], role: str) -> int:
    return next((i for i, m in enumerate(messages) if m[0] == role), -1)


def verify_tombstone(run: Run) -> list[str]:
    """A purged run has no patches to replay: its skeleton must still be continuous
    (seq from 1, each from_state the previous to_state, ending in the run's state), add
    up to the run row's counters, and every decision must name a call by hash, one the
    journal holds when the call ran."""
    problems: list[str] = []
    seqs = []
    previous = ""
    cost = tokens = 0
    for seq, from_state, to_state, c, n, payload in run.transitions.order_by("seq").values_list(
        "seq", "from_state", "to_state", "cost_micros", "tokens", "payload"
    ):
        if seq == 1 and run.fork_seq is not None:
            cost, tokens = inherited(payload)  # a fork's counters start from its parent's
        seqs.append(seq)
        if from_state != previous:
            problems.append(f"seq {seq}: from {from_state!r} but the previous transition ended in {previous!r}")
        previous = to_state
        cost += c
        tokens += n
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"seq is not contiguous from 1: {_gaps(seqs)}")
    if run.version != len(seqs):
        problems.append(f"version {run.version} != {len(seqs)} transitions")
    if previous != run.state:
        problems.append(f"the last transition ends in {previous!r}, the run is {run.state!r}")
    if cost != run.cost_micros:
        problems.append(f"transition costs sum to {cost}, cached {run.cost_micros}")
    if tokens != run.tokens:
        problems.append(f"transition tokens sum to {tokens}, cached {run.tokens}")
    if Message.objects.filter(run=run).exists():
        problems.append("purged, yet transcript rows remain")
    journal = {
        key: (args, status)
        for key, args, status in ToolCall.objects.filter(run=run).values_list("idempotency_key", "args_sha256", "status")
    }
    if any(not args for args, _ in journal.values()):
        problems.append("a journal entry has no arguments hash")
    for a in Approval.objects.filter(run=run).order_by("pk").only("pk", "status", "idempotency_key", "args_sha256"):
        if not a.args_sha256:
            problems.append(f"approval {a.pk}: no arguments hash")
        elif a.status == Approval.Status.APPROVED:
            entry = journal.get(a.idempotency_key)
            if entry is None:
                problems.append(f"approval {a.pk}: approved, but the journal has no entry {a.idempotency_key[:12]}")
            elif entry[0] != a.args_sha256:
                problems.append(f"approval {a.pk}: decided on arguments {a.args_sha256[:12]}, the journal ran {entry[0][:12]}")
    return problems


def _gaps(seqs: list[int]) -> str:
    return ", ".join(str(s) for s in seqs[:20]) + (" ..." if len(seqs) > 20 else "")


def payload_bytes(run: Run) -> int:
    """The bytes a run's history holds as data (before row and index overhead)."""
    total = 0
    for t in Transition.objects.filter(run=run):
        total += len(json.dumps(t.payload)) + len(t.from_state) + len(t.to_state) + len(t.kind) + len(t.actor)
    for m in Message.objects.filter(run=run):
        total += len(m.content) + len(json.dumps(m.tool_calls)) + len(m.tool_call_id) + len(m.role)
    for c in ToolCall.objects.filter(run=run):
        total += len(json.dumps(c.args)) + len(json.dumps(c.result)) + len(c.idempotency_key)
    return total
