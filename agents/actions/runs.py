"""A run's actions: launch (an idempotency key, the tools a run gets, a continued run's
taint), cancel, hold, release, and revoking a grant."""

from __future__ import annotations

import functools
import hashlib
import json
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from agents import access
from agents.actions.base import ActionError, actor_name, wake_after_commit
from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.human import cancel, revoke_grant
from agents.engine.limits import TASK_MAX_CHARS, LimitError, Limits
from agents.engine.registry import PATTERN
from agents.engine.run import new_run
from agents.lib import faults, sanitize
from agents.llm.scripted import ScriptError, validate_script
from agents.models import AgentProfile, Grant, IdempotencyKey, Run
from agents.ops import telemetry
from agents.runs import store
from agents.tools import registry, registry_for


def run_launch(
    *,
    agent: str | AgentProfile,
    task: str,
    user: Any = None,
    approver: str = engine_policy.HUMAN,
    limits: dict[str, Any] | None = None,
    script: Any = None,
    policy: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    idempotency_body: Any = None,
    by_launcher: bool = False,
    continues: Run | None = None,
    limit_defaults: dict[str, int] | None = None,
) -> Run:
    """Launch a run; `policy` may only tighten the profile's (docs/policy.md).

    `continues` (the gateway's streams): the run this one carries on from, linked on
    both timelines; a taint it had is carried over (`carried_taint`). `limit_defaults`:
    limits for the keys the profile's own `limits` leave unset (a stream's run is sized
    for a working day, docs/gateway.md).

    `by_launcher` (pages, API, gateway): `user` launches in their launcher role, so only
    a profile of a project where they hold it; another project's profile is answered
    as an unknown agent, and the known ones named are theirs alone. Without it (the
    commands, the evals) the caller answers for the user.

    With an `idempotency_key` (the API's `Idempotency-Key` header), the user's second
    launch with the same key and the same `idempotency_body` (the request as sent;
    the arguments by default) returns the run the first launched, with `replayed` set;
    the same key with another body is a 409 `idempotency_conflict`."""
    launch = functools.partial(
        _launch, agent=agent, task=task, user=user, approver=approver, limits=limits, script=script, policy=policy,
        by_launcher=by_launcher, continues=continues, limit_defaults=limit_defaults,
    )
    if not idempotency_key:
        return launch()
    if idempotency_body is None:
        idempotency_body = {
            "agent": agent if isinstance(agent, str) else agent.name, "task": task, "approver": approver,
            "limits": limits, "script": script, "policy": policy,
        }
    body_hash = hashlib.sha256(json.dumps(idempotency_body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    key = idempotency_key.replace("\x00", "")
    for _ in range(2):
        seen = IdempotencyKey.objects.select_related("run__profile").filter(user=user, key=key).first()
        if seen is not None:
            if seen.body_hash != body_hash:
                raise ActionError(
                    "idempotency_conflict", "this Idempotency-Key was used with a different body", status=409
                )
            seen.run.replayed = True
            return seen.run
        try:
            with transaction.atomic():
                run = launch()
                IdempotencyKey.objects.create(user=user, key=key, body_hash=body_hash, run=run)
            return run
        except IntegrityError:
            # A concurrent request with the same key won the insert; our run rolled back
            # with it (and its wake-up, which waits for the commit). Answer with theirs.
            continue
    raise ActionError("busy", "this Idempotency-Key is being used by a concurrent request; retry", status=409)


def _launch(
    *,
    agent: str | AgentProfile,
    task: str,
    user: Any,
    approver: str,
    limits: dict[str, Any] | None,
    script: Any,
    policy: dict[str, Any] | None,
    by_launcher: bool,
    continues: Run | None = None,
    limit_defaults: dict[str, int] | None = None,
) -> Run:
    offered = access.launchable_profiles(user) if by_launcher else AgentProfile.objects.all()
    profile = agent if isinstance(agent, AgentProfile) else AgentProfile.objects.filter(name=agent).first()
    if profile is not None and by_launcher and not access.can_launch(user, profile.project_id):
        profile = None  # another project's: answered like a missing one
    if profile is None:
        known = ", ".join(offered.order_by("name").values_list("name", flat=True))
        raise ActionError("unknown_agent", f"no agent profile named {agent!r} (known: {known})")
    if not isinstance(task, str) or not task.strip():
        raise ActionError("invalid_task", "the task must be non-empty text")
    if len(task) > TASK_MAX_CHARS:
        raise ActionError("invalid_task", f"the task is {len(task):,} characters; at most {TASK_MAX_CHARS:,} are taken")
    if approver not in engine_policy.APPROVERS:
        raise ActionError("invalid_approver", f"approver must be one of {', '.join(engine_policy.APPROVERS)}")
    if profile.provider == "scripted":
        if not settings.AIRLOCK_ALLOW_SCRIPTED:
            raise ActionError("scripted_disabled", "scripted runs are off (AIRLOCK_ALLOW_SCRIPTED)", status=403)
        try:
            validate_script(script if script is not None else [])
        except ScriptError as exc:
            raise ActionError("invalid_script", str(exc)) from None
        if not script:
            # It could only fail with "script exhausted" at its first model call.
            raise ActionError("invalid_script", "the scripted agent needs a script: a list of at least one decision")
    elif script is not None:
        raise ActionError("invalid_script", f"the {profile.name} agent takes no script")
    problem = profile.launch_problem()
    if problem is not None:
        # The profile's fault, not the caller's: named as such, and no other profile's.
        raise ActionError("invalid_profile", problem, status=409)
    try:
        base = profile.base_limits() if limit_defaults is None else Limits.from_dict(
            {**limit_defaults, **(profile.limits or {})})
        run_limits = base.tightened(limits)
    except LimitError as exc:
        raise ActionError("invalid_limits", str(exc)) from None
    try:
        run_policy = engine_policy.snapshot(profile.policy_fields(), policy)
    except engine_policy.PolicyError as exc:
        raise ActionError("invalid_policy", str(exc)) from None
    launch_rules = [r for r in run_policy["rules"] if r.get("origin") == "launch"]
    tools = run_tools(profile, expand=bool(launch_rules))
    if launch_rules:
        try:
            names = tools or registry_for(profile).names()
            engine_policy.check_rule_tools(launch_rules, names, field="policy.rules")
        except engine_policy.PolicyError as exc:
            raise ActionError("invalid_policy", str(exc)) from None
    state = new_run(
        "pending",
        limits=run_limits,
        now=time.time(),
        approver=approver,
        tools=tools,
        denied_tools=profile.denied_tools,
        always_ask_tools=profile.always_ask_tools,
        prices=profile.prices(),
        policy=run_policy,
        system_prompt=profile.system_prompt,
        task=task,
        context_tokens=profile.context_tokens,
    )
    if continues is not None and (source := carried_taint(continues)) is not None:
        state.tainted, state.taint_source = True, source
    with transaction.atomic():
        run = Run(
            profile=profile, task=sanitize.clean(task), created_by=user, approver=approver, script=sanitize.clean(script),
            trace_context=telemetry.new_trace_context(), continues=continues,
        )
        # The id is the run's identity in every idempotency key: take it first.
        state.run_id = str(store.reserve_id(run))
        store.create(run, state, actor=actor_name(user))
        transaction.on_commit(lambda: faults.crash_point("after_launch_commit"))
        wake_after_commit(run.pk)
    return run


def carried_taint(previous: Run) -> dict[str, Any] | None:
    """The taint source a run continuing `previous` starts with: `previous`'s, if it was
    tainted and last moved less than AIRLOCK_GATEWAY_TAINT_HOURS ago (a carried taint
    names the run it came from). None: nothing to carry."""
    if not previous.tainted:
        return None
    age = (timezone.now() - previous.updated_at).total_seconds()
    if age >= settings.AIRLOCK_GATEWAY_TAINT_HOURS * 3600:
        return None
    source = (previous.engine or {}).get("taint_source") or {}
    return {**source, "run": source.get("run", previous.pk)}


def run_tools(profile: AgentProfile, *, expand: bool = False) -> list[str] | None:
    """The tool names a new run (or fork) of `profile` snapshots; None: all. `expand`
    lists the registry's names even without a `NAME__*` entry (launch rules check them)."""
    tools = profile.tool_names()
    if expand or (tools and any(name.endswith(PATTERN) for name in tools)):
        # Only the profile's MCP tools are read, unless every name is wanted.
        offered = registry(None if expand else tools)
        # `NAME__*` (all of an MCP server's tools): the run snapshots the names on offer now.
        tools = offered.expand(tools)
    if profile.provider == "external":
        tools = _with_client_tools(profile, tools)
    return tools


def _with_client_tools(profile: AgentProfile, tools: list[str] | None) -> list[str] | None:
    """An external profile's tool list with its client tools, which must not take the
    name of a registered tool (the client would think it runs its own, Airlock another)."""
    try:
        specs = profile.client_specs()
    except ValidationError as exc:
        raise ActionError("invalid_profile", "; ".join(exc.messages), status=409) from None
    registered = registry()
    taken = [s.name for s in specs if s.name in registered]
    if taken:
        raise ActionError(
            "invalid_profile", f"client tool(s) named like registered tools: {', '.join(taken)}", status=409
        )
    if tools is None:
        return None  # every registered tool, and the client tools with them
    return [*tools, *(s.name for s in specs if s.name not in tools)]



def run_cancel(*, run_id: int, user: Any, reason: str = "") -> Run:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise ActionError("not_found", f"no run {run_id}", status=404)
    for _ in range(5):
        if run.state in states.TERMINAL:
            raise ActionError("not_active", f"run {run_id} already ended ({run.state})", status=409)
        state = store.load(run)
        who = user.get_username() if user else "system"
        after, t = cancel(state, f"cancelled by {who}" + (f": {reason}" if reason else ""))
        try:
            store.commit(run, state, after, t, actor=actor_name(user))
            return run
        except store.StaleRun:
            # A worker committed in between; cancel the state it left.
            run.refresh_from_db()
    raise ActionError("busy", f"run {run_id} kept moving; try again", status=409)


def run_hold(*, run_id: int, user: Any, reason: str) -> Run:
    """Put a run on legal hold: the purge never touches it until it is released.
    Holding a held run again replaces the reason (the latest word stands)."""
    reason = sanitize.clean(" ".join((reason or "").split())[:500])  # no NUL: PostgreSQL refuses it
    if not reason:
        raise ActionError("invalid_hold", "a hold needs a reason")
    # A conditional update: a purge batch that locked the row first wins, and the run
    # is a tombstone by the time this runs (then there is nothing left to hold).
    updated = Run.objects.filter(pk=run_id, purged_at__isnull=True).update(
        hold_reason=reason, held_by=user if getattr(user, "pk", None) else None, held_at=timezone.now()
    )
    if updated != 1:
        if not Run.objects.filter(pk=run_id).exists():
            raise ActionError("not_found", f"no run {run_id}", status=404)
        raise ActionError("purged", f"run {run_id} was already purged; its content is gone", status=409)
    return Run.objects.select_related("profile", "held_by").get(pk=run_id)


def run_release(*, run_id: int, user: Any) -> Run:
    """Lift a run's own hold (a profile's hold is lifted on the profile). Releasing a
    run that is not held answers with it unchanged."""
    if not Run.objects.filter(pk=run_id).exists():
        raise ActionError("not_found", f"no run {run_id}", status=404)
    Run.objects.filter(pk=run_id).exclude(hold_reason="").update(hold_reason="", held_by=None, held_at=None)
    return Run.objects.select_related("profile", "held_by").get(pk=run_id)


def grant_revoke(*, run_id: int, grant_id: int, user: Any) -> Grant:
    """End a run-scoped grant, as a transition on the run's timeline. Revoking a
    grant that is already revoked answers with it unchanged."""
    grant = Grant.objects.select_related("run").filter(pk=grant_id, run_id=run_id).first()
    if grant is None:
        raise ActionError("not_found", f"run {run_id} has no grant {grant_id}", status=404)
    for _ in range(5):
        if grant.revoked_at is not None:
            return grant
        run = grant.run
        if run.state in states.TERMINAL:
            raise ActionError("not_active", f"run {run_id} already ended ({run.state}); its grants ended with it", status=409)
        state = store.load(run)
        after, t = revoke_grant(state, grant.number, by=user.get_username() if user else "")
        try:
            store.commit(run, state, after, t, actor=actor_name(user), user=user)
        except store.StaleRun:
            # A worker (or another revocation) committed in between: look again.
            grant = Grant.objects.select_related("run").get(pk=grant_id)
            continue
        grant.refresh_from_db()
        return grant
    raise ActionError("busy", f"run {run_id} kept moving; try again", status=409)
