"""A step in `planning`: the model's turn (folding the context, calling the model,
pricing its reply) and each proposed call it made, checked and policed into its own
transition (a fork's calls its parent already made included).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from . import context, decisions, policy
from . import limits as limits_mod
from .fingerprints import fingerprint, idempotency_key
from .history import Answer, Figures, History, Query
from .protocols import Deps, ModelError, ModelReply, ModelRequest
from .registry import ToolSpec
from .run import Move, Outcome, RunState, approval_row, fail, intent_row, move_to
from .states import ACTING, AWAITING_APPROVAL, DONE, FAILED, PLANNING
from .transcript import tool_message


def compact(state: RunState, deps: Deps) -> Outcome | None:
    """Fold older tool results out of the prompt when it would exceed the budget."""
    assert state.context_tokens
    try:
        plan = context.plan(
            state.messages, _offered(state, deps), budget=state.context_tokens,
            folded_before=state.folded_before or 0, scale=state.token_scale,
        )
    except context.OverBudget as exc:
        return fail(state, (
            f"context budget: the prompt needs about {exc.tokens} tokens with every older tool result "
            f"folded, over context_tokens {state.context_tokens}"
        ))
    if plan is None:
        return None
    new = state.copy()
    new.folded_before = plan.folded_before
    detail = {
        "folded": plan.folded, "tokens_before": plan.tokens_before, "tokens_after": plan.tokens_after,
        "budget": state.context_tokens,
    }
    return move_to(new, PLANNING, Move(PLANNING, PLANNING, "compact", detail))


def call_model(state: RunState, deps: Deps) -> Outcome | None:
    # A client that decides without being shown the tools (an external agent's, whose
    # own code has them) is not sent them: listing them all can mean reading them.
    specs = _offered(state, deps) if getattr(deps.model, "reads_tools", True) else None
    started = time.monotonic()
    prompt = context.prompt(state.messages, state.folded_before or 0)
    request = ModelRequest(run_id=state.run_id, turn=state.model_calls, messages=prompt, tools=specs or [])
    try:
        reply = deps.model.propose(request)
    except ModelError as exc:
        return fail(state, f"model error: {exc}")
    if reply is None:
        return None  # an external agent's client has not proposed anything: the run rests
    duration = int((time.monotonic() - started) * 1000)
    new = state.copy()
    new.steps += 1
    new.model_calls += 1
    cost, tokens = _account(new, reply)
    if new.context_tokens and reply.usage is not None:
        specs = _offered(state, deps) if specs is None else specs
        new.token_scale = context.corrected_scale(reply.usage.input_tokens, context.raw_tokens(prompt, specs))
    calls, renamed = unique_calls(reply, state.model_calls)
    message: dict[str, Any] = {"role": "assistant", "content": reply.final or reply.text}
    if calls:
        message["tool_calls"] = calls
    detail: dict[str, Any] = {"decision": "final" if reply.final is not None else "calls"}
    detail["usage"] = None if reply.usage is None else reply.usage.to_dict()
    if renamed:
        detail["renamed_ids"] = renamed
    if reply.final is not None:
        new.answer = reply.final
        t = Move(PLANNING, DONE, "model", detail, cost, tokens, duration, [message])
        return move_to(new, DONE, t)
    detail["calls"] = len(calls)
    t = Move(PLANNING, PLANNING, "model", detail, cost, tokens, duration, [message])
    new.pending_calls = [c["id"] for c in calls[1:]]
    return propose(new, calls[0], deps, t)


def unique_calls(reply: ModelReply, turn: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The reply's calls with ids unique within it, and {new id: id the model gave}.

    Some OpenAI-compatible servers give several calls of one reply the same id; calls
    are found by id, so the second would be lost and the first run twice. The renamed
    id is what the transcript (and so the provider) sees from then on, for the call and
    its result alike, which keeps every call paired with its own result.
    """
    calls: list[dict[str, Any]] = []
    renamed: dict[str, str] = {}
    taken: set[str] = set()
    for i, c in enumerate(reply.calls):
        given = c.id or f"call_{turn}_{i}"
        call_id, n = given, 1
        while call_id in taken:
            n += 1
            call_id = f"{given}_{n}"
        if call_id != given:
            renamed[call_id] = given
        taken.add(call_id)
        calls.append({"id": call_id, "tool": c.tool, "args": c.args})
    return calls, renamed


def _account(new: RunState, reply: ModelReply) -> tuple[int, int]:
    """Tokens and cost of a model call. Cached prompt tokens are priced at the
    profile's cached-input price and cache writes at its cache-write price; a run
    whose prices lack those keys pays the input price for them."""
    usage = reply.usage
    if usage is None:
        new.cost_unknown = True
        return 0, 0
    tokens = usage.input_tokens + usage.output_tokens
    price_in = new.prices.get("input", 0)
    uncached = max(0, usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens)
    cost = math.ceil(
        (
            uncached * price_in
            + usage.cached_input_tokens * new.prices.get("cached_input", price_in)
            + usage.cache_write_tokens * new.prices.get("cache_write", price_in)
            + usage.output_tokens * new.prices.get("output", 0)
        )
        / 1_000_000
    )
    new.tokens += tokens
    new.cost_micros += cost
    return cost, tokens


def _offered(state: RunState, deps: Deps) -> list[ToolSpec]:
    return list(deps.registry.subset(state.tools))


def propose(new: RunState, call: dict[str, Any], deps: Deps, t: Move) -> Outcome:
    """Validate, check repeats, apply policy: one proposed call, one transition."""
    tool, args = call["tool"], call["args"]
    spec = deps.registry.get(tool) if (new.tools is None or tool in new.tools) else None
    t.detail["call"] = {"id": call["id"], "tool": tool}
    invalid = None
    if spec is None:
        offered = ", ".join(s.name for s in _offered(new, deps)) or "none"
        invalid = {"ok": False, "error": "unknown_tool", "detail": f"no tool named {tool!r}; available: {offered}"}
    elif (problem := spec.validate(args)) is not None:
        invalid = {"ok": False, "error": "invalid_arguments", "detail": problem}
    if invalid is not None:
        new.consecutive_errors += 1
        t.detail["invalid"] = invalid
        t.messages.append(tool_message(call, invalid))
        t.to_state = PLANNING
        return move_to(new, PLANNING, t)
    assert spec is not None
    fp = fingerprint(tool, args)
    lim = limits_mod.of_run(new.limits)
    times = deps.journal.executed(fp)
    streak = new.error_streak or {}
    if times >= lim.max_identical_calls:
        reason = (
            f"repeated identical call: {tool} with the same arguments already ran "
            f"{times} time(s) (max_identical_calls {lim.max_identical_calls})"
        )
        return _fail_from(new, t, reason)
    if streak.get("fp") == fp and streak.get("count", 0) >= limits_mod.IDENTICAL_ERROR_STREAK:
        reason = (
            f"repeated identical call: {tool} failed {streak['count']} times in a row "
            f"with the same error ({streak.get('error')})"
        )
        return _fail_from(new, t, reason)
    verdict = verdict_for(new, spec, tool, args, fp, _recorded(deps.history, t))
    t.detail["verdict"] = verdict.to_dict()
    if verdict.shadow:
        # What the profile's shadow rules would have decided: recorded, deciding nothing.
        t.detail["shadow"] = [dict(s) for s in verdict.shadow]
    current = {"id": call["id"], "tool": tool, "key": idempotency_key(new.run_id, new.steps, tool, args), "fp": fp}
    if spec.client:
        # The client runs it: the run rests in acting until `report` brings the result.
        current["client"] = True
    prior = _prior_call(new, fp) if verdict.action != "deny" else None
    if prior is not None:
        already = _already_ran(new, current, args, spec, verdict, prior, t, deps)
        if already is not None:
            return already
    if verdict.action == "allow":
        new.current_call = current
        t.intent = intent_row(new, current, args)
        t.to_state = ACTING
        return move_to(new, ACTING, t)
    if verdict.action == "ask":
        new.current_call = current
        new.approval = {"kind": "policy", "reason": verdict.reason}
        t.approval = approval_row(new, current, args, "policy", verdict.reason, spec, verdict)
        _set_expiry(new, t, deps.now())
        t.to_state = AWAITING_APPROVAL
        return move_to(new, AWAITING_APPROVAL, t)
    if verdict.no_approver:
        t.approval = {**approval_row(new, current, args, decisions.POLICY, verdict.reason, spec, verdict), "status": decisions.DENIED}
    t.messages.append(tool_message(call, policy.not_permitted(verdict.reason)))
    t.to_state = PLANNING
    return move_to(new, PLANNING, t)


def _recorded(history: History | None, t: Move) -> Answer | None:
    """The run's history provider, keeping on the move what it answered: the store
    checks those figures again under its locks when it commits (store.commit)."""
    if history is None:
        return None

    def answer(queries: Sequence[Query]) -> list[Figures]:
        figures = history.figures(queries)
        t.history.extend(zip(queries, figures, strict=True))
        return figures

    return answer


def _prior_call(state: RunState, fp: str) -> dict[str, Any] | None:
    """The parent's call with this fingerprint that took effect after the fork point."""
    if not state.fork:
        return None
    return next((p for p in state.fork.get("prior") or () if p.get("fp") == fp), None)


def prior_reason(prior: dict[str, Any]) -> str:
    where = f"this exact call already ran in run #{prior.get('run')} at step {prior.get('seq')}"
    if prior.get("status") != "succeeded":
        return f"{where}; outcome unknown: it may or may not have taken effect"
    return where


def _already_ran(
    new: RunState,
    current: dict[str, Any],
    args: Any,
    spec: ToolSpec,
    verdict: policy.Verdict,
    prior: dict[str, Any],
    t: Move,
    deps: Deps,
) -> Outcome | None:
    """A fork's call that its parent already made after the fork point: never repeated
    blindly. A safe tool reuses the recorded result (the fork's `reuse`: "recorded") or
    runs again ("none", or no result to reuse); an unsafe or irreversible one asks a
    human: reuse that result, run it again, or reject. None: go on as any call.

    Each of the parent's calls is met once: a second identical proposal is a new call."""
    assert new.fork is not None
    rest = list(new.fork.get("prior") or [])
    rest.remove(prior)
    new.fork = {**new.fork, "prior": rest}
    ref = {k: prior.get(k) for k in ("run", "seq", "step", "status", "key")}
    t.detail["prior"] = ref
    if spec.retry_safety == "safe" and spec.risk != "irreversible":
        if new.fork.get("reuse") != "recorded" or prior.get("status") != "succeeded":
            return None
        new.current_call = {**current, "reuse": ref}
        t.intent = intent_row(new, new.current_call, args)
        t.to_state = ACTING
        return move_to(new, ACTING, t)
    reason = prior_reason(prior)
    if verdict.action == "ask":
        reason = f"{reason}; and {verdict.reason}"
    new.current_call = current
    new.approval = {"kind": decisions.ALREADY_RAN, "reason": reason, "prior": ref}
    row = approval_row(new, current, args, decisions.ALREADY_RAN, reason, spec, verdict)
    if verdict.action != "ask":
        # The prior run asks here, not the policy: a rule that would have allowed the call
        # is no reason it was asked, and the card must not name it as one.
        row["rule"], row["required"] = None, 1
    t.approval = {**row, "prior": ref}
    _set_expiry(new, t, deps.now())
    t.to_state = AWAITING_APPROVAL
    return move_to(new, AWAITING_APPROVAL, t)


def verdict_for(
    state: RunState, spec: ToolSpec | None, tool: str, args: Any, fp: str, history: Answer | None = None
) -> policy.Verdict:
    """The run's policy on one call: what the model proposed, a reviewer's edit, or a
    recorded call a backtest judges again (agents/runs/backtest.py): the one judge.
    `history` answers the history rules' queries (None: they fail closed)."""
    return policy.verdict(
        spec,
        tool,
        denied=state.denied_tools,
        always_ask=state.always_ask_tools,
        tainted=state.tainted,
        approver=state.approver,
        args=args,
        policy=state.policy,
        grants=state.grants,
        fingerprint=fp,
        history=history,
    )


def _fail_from(new: RunState, t: Move, reason: str) -> Outcome:
    """Fail inside a transition that already carries a model reply."""
    new.error = reason
    new.pending_calls = []
    new.current_call = None
    t.detail["reason"] = reason
    t.to_state = FAILED
    return move_to(new, FAILED, t)


def _set_expiry(new: RunState, t: Move, now: float) -> None:
    """A policy approval expires after the run's approval timeout, never after the
    run's deadline (which fails the run first). No timeout: only the deadline."""
    timeout = new.policy.get("approval_timeout_seconds")
    if not timeout or new.approval is None or t.approval is None:
        return
    expires_at = min(now + timeout, new.deadline) if new.deadline else now + timeout
    new.approval.update(expires_at=expires_at, timeout_seconds=timeout)
    t.approval["expires_at"] = expires_at
