"""Forks and retries (docs/retry.md): a new run that starts from another run's state as
of one of its transitions, without repeating what already happened.

The fork copies the parent's transcript and counters up to the fork point into its own
first transition (kind "fork", not re-billed), then runs on its profile as it is now.
The parent's calls that took effect after the fork point travel in the fork's engine
state (`RunState.fork["prior"]`), so the engine can tell when the fork proposes one of
them again (agents/engine/planning.py, `_already_ran`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction

from agents import access, broker
from agents.actions.base import ActionError, actor_name
from agents.actions.runs import run_tools
from agents.engine import patch, states
from agents.engine import policy as engine_policy
from agents.engine.limits import DEFAULTS, TASK_MAX_CHARS, LimitError
from agents.engine.run import RunState
from agents.lib import sanitize
from agents.models import Message, Run, ToolCall
from agents.models.runs import engine_message
from agents.runs import store
from agents.tools import registry_for

# Where a fork may start: before a model call or after a tool result, never inside a
# call (acting), while a human is asked (awaiting_approval) or after the end.
RESTING = frozenset({states.QUEUED, states.PLANNING})
REUSE = ("recorded", "none")
# Journal statuses of a call that took effect (succeeded) or may have (started: the
# outcome is unknown; intended: the parent ended while acting, and a worker that read the
# call before the end may still begin it, so it counts as started). A failed call
# reported an error: running it again is the point.
EFFECTS = ("succeeded", "started", "intended")
MAX_BULK = 200


@dataclass(frozen=True)
class ForkPoint:
    requested: int
    used: int
    engine: dict[str, Any]  # the parent's engine state as of `used`
    why: str  # why `used` is not `requested`, or ""

    def to_dict(self) -> dict[str, Any] | None:
        if self.used == self.requested:
            return None
        return {"requested": self.requested, "used": self.used, "why": self.why}


class RetryResult(TypedDict, total=False):
    id: int
    outcome: str  # retried | refused | not_found
    run: int
    detail: str


def fork_point(parent: Run, requested: Any) -> ForkPoint:
    """The resting point at or before `requested`, with the parent's state there,
    replayed from its transitions' patches (as verify does)."""
    if parent.purged_at is not None:
        raise ActionError("purged", f"run {parent.pk} was purged: its history is gone and cannot be forked")
    if isinstance(requested, bool) or not isinstance(requested, int) or not 1 <= requested <= parent.version:
        raise ActionError(
            "invalid_fork_point", f"from_seq must be a transition of run {parent.pk}: 1 to {parent.version}, not {requested!r}"
        )
    engine: dict[str, Any] = {}
    used, at_used, last_state = 0, engine, ""
    for seq, to_state, payload in (
        parent.transitions.filter(seq__lte=requested).order_by("seq").values_list("seq", "to_state", "payload")
    ):
        # patch.apply returns a new dict and never changes its input: keeping a
        # reference to an earlier state is safe.
        engine = patch.apply(engine, payload.get("patch", {}))
        last_state = to_state
        if to_state in RESTING:
            used, at_used = seq, engine
    if not used:
        raise ActionError("invalid_fork_point", f"run {parent.pk} has no resting point at or before seq {requested}")
    why = ""
    if used != requested:
        where = {
            states.ACTING: "a tool call was under way",
            states.AWAITING_APPROVAL: "the run waited for a human",
        }.get(last_state, f"the run had ended ({last_state})")
        why = (
            f"seq {requested} is not a resting point ({where}); the fork starts after seq {used}, "
            "the nearest earlier one (before a model call or after a tool result)"
        )
    return ForkPoint(requested, used, at_used, why)


def prior_calls(parent: Run, point: ForkPoint) -> list[dict[str, Any]]:
    """The parent's calls that took effect (or may have) after the fork point.

    A call's journal `step` is the run's step counter when it was proposed, and the
    counter only grows: every call proposed after the fork point has a step at least the
    fork point's, every earlier one less (a resting point has no call in flight)."""
    steps_at = int(point.engine.get("steps", 0))
    rows = list(
        ToolCall.objects.filter(run=parent, status__in=EFFECTS, step__gte=steps_at)
        .order_by("id")
        .values("idempotency_key", "fingerprint", "tool", "status", "step", "call_id")
    )
    if not rows:
        return []
    # The seq of each call's last transition (its result, or where it was left): what the
    # reviewer is told to look at on the parent's timeline.
    seqs: dict[str, int] = {}
    for seq, payload in parent.transitions.filter(seq__gt=point.used).order_by("seq").values_list("seq", "payload"):
        call = payload.get("call")
        call_id = call.get("id") if isinstance(call, dict) else payload.get("call_id")
        if call_id:
            seqs[str(call_id)] = seq
    return [
        {
            "fp": r["fingerprint"], "key": r["idempotency_key"], "tool": r["tool"],
            "status": "succeeded" if r["status"] == "succeeded" else "started",
            "step": r["step"], "seq": seqs.get(r["call_id"]), "run": parent.pk,
        }
        for r in rows
    ]


def effect_plan(parent: Run, prior: list[dict[str, Any]], reuse: str) -> list[dict[str, Any]]:
    """What the fork would do if its model proposes each of the parent's calls again:
    `reuse` the recorded result, `ask` a human, or `run_again` (the engine's rule in
    planning._already_ran, told ahead for a dry run)."""
    registry = registry_for(parent.profile, sorted({p["tool"] for p in prior}))
    plan = []
    for p in prior:
        spec = registry.get(p["tool"])
        repeatable = spec is not None and spec.retry_safety == "safe" and spec.risk != "irreversible"
        if not repeatable:
            what = "ask"
        elif reuse == "recorded" and p["status"] == "succeeded":
            what = "reuse"
        else:
            what = "run_again"
        plan.append({"tool": p["tool"], "seq": p["seq"], "status": p["status"], "plan": what})
    return plan


def _policy(parent_engine: dict[str, Any], profile: Any) -> dict[str, Any]:
    """The profile's policy as it is now, with the parent's launch rules first and its
    launch settings where they are tighter: a fork never loosens what its launcher set."""
    old = engine_policy.effective(parent_engine.get("policy") or {})
    launch_rules = [
        {k: v for k, v in r.items() if k not in ("origin", "index")} for r in old["rules"] if r.get("origin") == "launch"
    ]
    try:
        new = engine_policy.snapshot(profile.policy_fields(), {"rules": launch_rules})
    except engine_policy.PolicyError as exc:
        raise ActionError("invalid_policy", f"the parent's launch rules no longer fit the profile: {exc}") from None
    new["irreversible_approvals"] = max(new["irreversible_approvals"], old["irreversible_approvals"])
    new["separate_duties"] = bool(new["separate_duties"] or old["separate_duties"])
    timeouts = [t for t in (new["approval_timeout_seconds"], old["approval_timeout_seconds"]) if t is not None]
    new["approval_timeout_seconds"] = min(timeouts) if timeouts else None
    return new


def _transcript(parent: Run, point: ForkPoint, profile: Any, task: str | None) -> list[dict[str, Any]]:
    """The parent's messages up to the fork point, with the profile's current system
    prompt and, when given, the replacement task."""
    rows = Message.objects.filter(run=parent, seq__lte=point.used).order_by("index").values_list(*Message.ENGINE_FIELDS)
    messages = [engine_message(*row) for row in rows]
    if messages and messages[0]["role"] == "system" and profile.system_prompt:
        messages[0] = {**messages[0], "content": profile.system_prompt}
    if task is not None:
        first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first is not None:
            messages[first] = {**messages[first], "content": task}
    return messages


def run_fork(
    *,
    run_id: int,
    user: Any,
    from_seq: Any,
    task: str | None = None,
    limits: dict[str, Any] | None = None,
    note: str = "",
    reuse: str = "recorded",
    retry: bool = False,
) -> tuple[Run, ForkPoint]:
    """Fork run `run_id` after transition `from_seq` (or the nearest earlier resting
    point); returns the new run and the fork point used.

    1. Refuse what cannot be forked: an unknown run or reuse value, a purged parent, an
       external agent's run, a parent still running (409 `parent_live`), a bad task,
       limits looser than the profile's.
    2. Replay the parent's transitions to the fork point: the state there (transcript,
       taint, counters) is the fork's start, on the profile as it is now. Approvals and
       grants are not copied: a call that needs a human asks again.
    3. List the parent's calls that took effect after the fork point (the journal).
    4. Insert the fork with its one "fork" transition and the copied messages, and wake a
       worker after commit. With `retry`, the parent row is locked first and a parent
       already retried by a live or finished fork is refused (two retries at once: the
       second waits for the lock, then finds the first).
    """
    parent = Run.objects.select_related("profile").filter(pk=run_id).first() if 0 < run_id <= access.MAX_ID else None
    if parent is None:
        raise ActionError("not_found", f"no run {run_id}", status=404)
    if reuse not in REUSE:
        raise ActionError("invalid_reuse", f"reuse must be one of {', '.join(REUSE)}, not {reuse!r}")
    profile = parent.profile
    problem = profile.launch_problem()
    if problem is not None:
        raise ActionError("invalid_profile", problem, status=409)
    if profile.provider == "external":
        raise ActionError("not_forkable", "an external agent's run is driven by its client and cannot be forked")
    if parent.state not in states.TERMINAL:
        # The fork's list of the parent's effects (prior_calls) is read once, now: a live
        # parent's later calls would be unseen, and an unsafe one repeated in the fork
        # without a human. An ended run takes no further step (terminal states are
        # final), so once it has ended the list is complete.
        raise ActionError(
            "parent_live",
            f"run {parent.pk} is still {parent.state}: a fork could repeat what it does next; "
            "cancel it, or wait for it to end, then fork",
            status=409,
        )
    if profile.provider == "scripted" and not settings.AIRLOCK_ALLOW_SCRIPTED:
        raise ActionError("scripted_disabled", "scripted runs are off (AIRLOCK_ALLOW_SCRIPTED)", status=403)
    if task is not None:
        if not isinstance(task, str) or not task.strip():
            raise ActionError("invalid_task", "the task must be non-empty text")
        if len(task) > TASK_MAX_CHARS:
            raise ActionError("invalid_task", f"the task is {len(task):,} characters; at most {TASK_MAX_CHARS:,} are taken")
        task = sanitize.clean(task)
    point = fork_point(parent, from_seq)
    engine = point.engine
    base = profile.base_limits()
    # The parent's limits carry over (clamped to the profile's, which may have tightened
    # since); `limits` may raise them up to the profile's, never beyond.
    carried = {k: min(int(v), getattr(base, k)) for k, v in (engine.get("limits") or {}).items() if k in DEFAULTS}
    try:
        run_limits = base.tightened({**carried, **(limits or {})})
    except LimitError as exc:
        raise ActionError("invalid_limits", str(exc)) from None
    run_policy = _policy(engine, profile)
    state = RunState.from_json(engine, _transcript(parent, point, profile, task))
    state.state = states.QUEUED
    state.limits = run_limits.to_dict()
    # Absolute from the fork, as a launch's: a run that failed on its deadline can go on.
    state.deadline = time.time() + run_limits.deadline_seconds
    state.answer = state.error = None
    state.current_call = state.approval = None
    state.grants = []
    state.tools = run_tools(profile, expand=any(r.get("origin") == "launch" for r in run_policy["rules"]))
    state.denied_tools = list(profile.denied_tools or [])
    state.always_ask_tools = list(profile.always_ask_tools or [])
    state.prices = profile.prices()
    state.policy = run_policy
    state.context_tokens = profile.context_tokens or None
    state.fork = {"run": parent.pk, "seq": point.used, "reuse": reuse, "prior": prior_calls(parent, point)}
    detail = {
        "fork": {
            "run": parent.pk, "seq": point.used, "requested": point.requested, "why": point.why, "reuse": reuse,
            "note": sanitize.clean(note or "")[:2000], "retry": retry,
            # What the copied block shows, without replaying the parent again.
            "steps": int(engine.get("steps", 0)), "cost_micros": int(engine.get("cost_micros", 0)),
            "tokens": int(engine.get("tokens", 0)), "messages": len(state.messages),
        },
        # Top-level numbers outlive a purge (retention.skeleton): what verify starts a
        # fork's sums from, tombstone or not.
        "inherited_cost_micros": int(engine.get("cost_micros", 0)),
        "inherited_tokens": int(engine.get("tokens", 0)),
    }
    with transaction.atomic():
        if retry:
            Run.objects.select_for_update().filter(pk=parent.pk).first()
            earlier = (
                Run.objects.filter(forked_from=parent).exclude(state__in=(states.FAILED, states.CANCELLED)).order_by("pk").first()
            )
            if earlier is not None:
                raise ActionError("already_retried", f"run {parent.pk} was already retried as run {earlier.pk}", status=409)
        run = Run(
            profile=profile, task=task if task is not None else parent.task, created_by=user, approver=parent.approver,
            script=parent.script, forked_from=parent, fork_seq=point.used,
        )
        state.run_id = str(store.reserve_id(run))
        store.create(run, state, actor=actor_name(user), kind="fork", detail=detail)
        fork_id = run.pk
        # Wake a worker once the rows are visible; the sweeper covers a lost wake-up.
        transaction.on_commit(lambda: broker.wake_run(fork_id))
    return run, point


def run_retry(*, run_id: int, user: Any, limits: dict[str, Any] | None = None) -> tuple[Run, ForkPoint]:
    """Retry a failed run from its last resting point before the failure."""
    parent = Run.objects.filter(pk=run_id).only("pk", "state", "version").first() if 0 < run_id <= access.MAX_ID else None
    if parent is None:
        raise ActionError("not_found", f"no run {run_id}", status=404)
    if parent.state != states.FAILED:
        raise ActionError("not_failed", f"only a failed run can be retried; run {run_id} is {parent.state}", status=409)
    return run_fork(run_id=run_id, user=user, from_seq=parent.version, limits=limits, note="retry", retry=True)


def runs_retry(*, ids: list[int], user: Any, limits: dict[str, Any] | None = None) -> list[RetryResult]:
    """Retry many failed runs, one result per id, in the order given (a repeated id is
    answered once). `user` None: the command line, which may retry any run."""
    if len(ids) > MAX_BULK:
        raise ActionError("too_many", f"at most {MAX_BULK} runs at a time, not {len(ids)}")
    results: list[RetryResult] = []
    for run_id in dict.fromkeys(ids):
        run = Run.objects.filter(pk=run_id).first() if 0 < run_id <= access.MAX_ID else None
        if run is None or (user is not None and not access.can_read_run(user, run)):
            results.append({"id": run_id, "outcome": "not_found", "detail": f"no run {run_id}"})
            continue
        if user is not None and not access.can_fork(user, run):
            results.append({"id": run_id, "outcome": "refused", "detail": "retrying this run needs the operator role"})
            continue
        try:
            fork, point = run_retry(run_id=run_id, user=user, limits=limits)
        except ActionError as exc:
            results.append({"id": run_id, "outcome": "refused", "detail": str(exc.detail)})
            continue
        results.append({"id": run_id, "outcome": "retried", "run": fork.pk, "detail": f"forked after seq {point.used}"})
    return results


def retry_candidates(run: Run) -> dict[str, Any]:
    """What retrying `run` would do (a dry run): the fork point, and for each of its
    calls after that point whether the retry would reuse its result, ask, or run it."""
    point = fork_point(run, run.version)
    return {"fork_seq": point.used, "effects": effect_plan(run, prior_calls(run, point), "recorded")}
