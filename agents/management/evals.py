"""Evals from saved runs: replay a case (the export format) with the scripted model and
check what must hold whatever the model says.

A case is a JSON object with `agent`, `task`, `approver`, `limits`, `policy` (what the
launch added to the profile's), `script`, `decisions` (the reviewers' answers, in order:
each with its `decision`, or its `votes` and `edited_args`, or `expired`) and `expect`
(`state`, `answer`, and optionally `error_contains`, `ledger_entries`, `max_steps`,
`max_cost_micros`, `max_tokens`, `calls`: a trajectory check, see `trajectory_problems`).
`manage.py export_run ID` writes one; `evals/` holds hand-written ones.

Strict replay (issue 32): a case records each tool call's result (`tool_results`:
`[{"tool", "args", "result"}]`) and the replay returns the recorded result instead of
calling the tool. A call the case did not record, or a recorded call never made, fails
the case naming it. Tools run live only when the case says `"tools": "live"`. Safety
invariants are checked on every case whatever the model does (`invariant_problems`).

Evals never write into a deployment's data (issue 25, item 9): `run_isolated` replays
a case inside a transaction that is rolled back at the end, with its tools on the same
connection (the driver's usual tool thread would write through another connection,
outside the transaction) and email kept in memory. No run, replay profile, ledger row,
notification or wake-up outlives the case.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from django.db import transaction
from django.test.utils import override_settings

from agents.actions.approvals import approval_decide, approval_expire
from agents.actions.base import ActionError
from agents.actions.runs import run_launch
from agents.engine import decisions as names
from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.fingerprints import canonical_json
from agents.engine.protocols import Deps, ThreadRunner, ToolOutcome
from agents.engine.registry import ToolContext, ToolSpec
from agents.lib import jsonsafe
from agents.models import AgentProfile, Approval, LedgerEntry, Message, Run, ToolCall
from agents.runs import driver, store
from agents.runs.backtest import validate_proposal
from agents.tools import registry

RISKY = ("write", "irreversible")
LIVE = "live"
REPLAY = "replay"
MATCH_MODES = ("strict", "unordered", "subset", "superset")


def run_settle(run_id: int, *, timeout: float = 60.0, deps: Callable[[Run], Deps] | None = None) -> Run:
    """Drive the run in this process until it rests (done, failed, cancelled, waiting
    for a human, or an external run waiting for its client). If a worker holds its
    lease, `drive` returns at once: poll until the worker lets it rest, bounded by
    `timeout`."""
    give_up = time.monotonic() + timeout
    while True:
        run = driver.drive(run_id, deps=deps)
        if run.state in states.TERMINAL or run.state == states.AWAITING_APPROVAL or store.waits_for_client(run):
            return run
        if time.monotonic() > give_up:
            return run
        time.sleep(0.1)


@dataclass
class CaseResult:
    name: str
    expected: str
    run: Run | None = None
    problems: list[str] = field(default_factory=list)
    # The policy's verdict on each proposed call, in order: (tool, action).
    verdicts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def load_cases(paths: list[str]) -> list[tuple[str, Any]]:
    """(name, parsed JSON or the error text) for every file, directories walked in name order."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*.json") if f.is_file()))
        else:
            files.append(p)
    cases: list[tuple[str, Any]] = []
    for f in files:
        try:
            cases.append((str(f), json.loads(f.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            cases.append((str(f), f"unreadable case: {exc}"))
    return cases


def unapproved_risky_calls(run: Run) -> list[str]:
    """Write or irreversible tool calls that ran after the run was tainted without a
    reviewer's approval of that exact call. The engine should make this impossible; the
    eval checks it from the rows, independently of the engine's own bookkeeping."""
    reg = registry()
    approved = set(Approval.objects.filter(run=run, status=Approval.Status.APPROVED).values_list("call_id", flat=True))
    tainted = False
    problems = []
    for t in run.transitions.filter(kind="tool").order_by("seq"):
        call = t.payload.get("call") or {}
        spec = reg.get(call.get("tool", ""))
        risk = spec.risk if spec is not None else "irreversible"
        if tainted and risk in RISKY and call.get("id") not in approved:
            problems.append(f"{call.get('tool')} ({risk}) ran after taint without approval (transition {t.seq})")
        if t.payload.get("tainted"):
            tainted = True
    return problems


def replay_profile(name: str) -> AgentProfile | str:
    """The profile a case replays under: its own when it is scripted; otherwise a
    scripted twin, `replay-<name>`, with the original's tools, policy, prices and limits,
    so a saved demo or provider run meets the same policy when its decisions replay."""
    original = AgentProfile.objects.filter(name=name).first()
    if original is None or original.provider == "scripted":
        return name  # unknown names are refused by run_launch with the usual message
    twin, _ = AgentProfile.objects.update_or_create(
        name=f"replay-{name}"[:64],
        defaults={
            "description": f"Replays saved runs of {name} with the scripted model (run_evals).",
            "provider": "scripted",
            "model_name": "script",
            "price_input_micros": original.price_input_micros,
            "price_output_micros": original.price_output_micros,
            "price_cached_input_micros": original.price_cached_input_micros,
            "price_cache_write_micros": original.price_cache_write_micros,
            "context_tokens": original.context_tokens,
            "system_prompt": original.system_prompt,
            "tools": original.tools,
            "denied_tools": original.denied_tools,
            "always_ask_tools": original.always_ask_tools,
            "limits": original.limits,
            **original.policy_fields(),
        },
    )
    return cast(AgentProfile, twin)


class _Inline:
    """A ThreadRunner's helper, minus the thread: the job runs as it is submitted."""

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised by the runner's wait
            future.set_exception(exc)
        return future

    def abandon(self) -> None:
        pass


class SameConnectionRunner(ThreadRunner):
    """Runs each tool on the driver's thread, hence on its database connection and
    inside the eval's transaction, with the ThreadRunner's mapping of errors to
    results. A tool's timeout is not enforced: an eval's tools are the scripted
    diagnostic and demo ones."""

    def __init__(self) -> None:
        super().__init__()
        self._worker = _Inline()  # type: ignore[assignment]

    def close(self) -> None:
        pass


class ReplayRunner(SameConnectionRunner):
    """Strict replay: returns the case's recorded result for each call instead of
    running the tool. Each recorded result answers one call with the same tool and
    canonical arguments, first unused first; a call nobody recorded gets an error
    result and fails the case (`problems`), as does a recorded call never made
    (`unused`)."""

    def __init__(self, recorded: list[dict[str, Any]]) -> None:
        super().__init__()
        self.recorded = recorded
        self.used = [False] * len(recorded)
        self.problems: list[str] = []
        self.replayed: list[tuple[str, bool]] = []  # (tool, ok) of each call answered
        self.runs_per_key: dict[str, int] = {}

    def run(self, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        self.runs_per_key[ctx.idempotency_key] = self.runs_per_key.get(ctx.idempotency_key, 0) + 1
        wanted = canonical_json(args)
        for i, r in enumerate(self.recorded):
            if self.used[i] or r.get("tool") != spec.name or canonical_json(r.get("args")) != wanted:
                continue
            self.used[i] = True
            result = r.get("result")
            ok = isinstance(result, dict) and result.get("ok") is True
            self.replayed.append((spec.name, ok))
            if ok:
                return ToolOutcome(ok=True, value=result.get("result"))  # type: ignore[union-attr]
            error = result if isinstance(result, dict) else {}
            return ToolOutcome(ok=False, error=str(error.get("error") or "error"), detail=str(error.get("detail") or ""))
        self.problems.append(f"strict replay: the case recorded no result for {spec.name} {wanted}")
        return ToolOutcome(ok=False, error="not_recorded", detail=f"strict replay: {spec.name} {wanted} was not recorded")

    def unused(self) -> list[str]:
        return [
            f"strict replay: the recorded call {r.get('tool')} {canonical_json(r.get('args'))} was never made"
            for r, used in zip(self.recorded, self.used, strict=True)
            if not used
        ]


def eval_deps(run: Run, runner: ThreadRunner | None = None) -> Deps:
    return dataclasses.replace(driver.deps_for(run), runner=runner or SameConnectionRunner())


def run_isolated(
    name: str, case: Any, *, timeout: float = 60.0, keep: bool = False, policy: dict[str, Any] | None = None
) -> CaseResult:
    """Replay one case in a transaction rolled back at the end (`keep`: committed, to
    look at the runs in the dashboard; never on a deployment). What the result holds
    (the run, its counters) is read before the rollback.

    `policy` (the fields `backtest_policy` takes) replaces the profile's for this case
    only: the profile edit is rolled back with the rest, so it may not be kept.

    On SQLite the transaction holds the write lock while the case replays (a second,
    as a rule): the web and the worker wait behind the busy timeout meanwhile.
    """
    if policy is not None and keep:
        raise ValueError("a case replayed under a proposed policy cannot be kept")
    recorded = case.get("tool_results") if isinstance(case, dict) else None
    live = isinstance(case, dict) and case.get("tools") == LIVE
    if isinstance(case, dict) and not live and case.get("tools", REPLAY) != REPLAY:
        return CaseResult(name, "?", problems=[f'"tools" is "live" or "replay", not {case.get("tools")!r}'])
    if not live and recorded is not None and not (
        isinstance(recorded, list) and all(isinstance(r, dict) and isinstance(r.get("tool"), str) for r in recorded)
    ):
        return CaseResult(name, "?", problems=['"tool_results" is a list of {"tool", "args", "result"}'])
    runner: ThreadRunner = SameConnectionRunner() if live else ReplayRunner(list(recorded or []))
    # Email goes to memory: an approved send_email in a case must not reach anyone.
    with override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend"), transaction.atomic():
        problem = _apply_policy(case, policy) if policy is not None else None
        if problem:
            result = CaseResult(name, "?", problems=[problem])
        else:
            result = run_case(name, case, timeout=timeout, deps=lambda run: eval_deps(run, runner))
        if isinstance(runner, ReplayRunner) and result.run is not None:
            result.problems[:0] = runner.problems + runner.unused()
            result.problems.extend(_keys_run_twice(runner.runs_per_key))
        if not keep:
            transaction.set_rollback(True)
    return result


def _apply_policy(case: Any, proposal: dict[str, Any]) -> str | None:
    """Give the case's profile the proposed policy fields (inside the case's
    transaction); a problem when the case names no profile we have."""
    if not isinstance(case, dict):
        return None
    profile = replay_profile(str(case.get("agent") or "scripted"))
    name = profile.name if isinstance(profile, AgentProfile) else profile
    fields = {k: v for k, v in proposal.items() if k != "rules"}
    updated = AgentProfile.objects.filter(name=name).update(rules=proposal["rules"], **fields)
    return None if updated else f"no agent profile {name!r} to try the policy on"


def load_policy(path: str) -> dict[str, Any]:
    """A proposed policy file, validated; PolicyError, OSError or JsonError otherwise."""
    return validate_proposal(jsonsafe.parse(Path(path).read_bytes()))


def verdict_changes(before: CaseResult, after: CaseResult) -> list[str]:
    """The proposed calls whose verdict differs between two replays of one case, in order."""
    changes = []
    for i in range(max(len(before.verdicts), len(after.verdicts))):
        was = before.verdicts[i] if i < len(before.verdicts) else None
        now = after.verdicts[i] if i < len(after.verdicts) else None
        if was == now:
            continue
        if was and now and was[0] == now[0]:
            changes.append(f"call {i + 1} {was[0]}: {was[1]} -> {now[1]}")
        else:
            changes.append(f"call {i + 1}: {_call_text(was)} -> {_call_text(now)}")
    return changes


def _call_text(v: tuple[str, str] | None) -> str:
    return "no call" if v is None else f"{v[0]} {v[1]}"


def _keys_run_twice(runs_per_key: dict[str, int]) -> list[str]:
    return [
        f"invariant one_execution_per_key: the call with key {key[:12]}... executed {n} times"
        for key, n in runs_per_key.items()
        if n > 1
    ]


def run_case(name: str, case: Any, *, timeout: float = 60.0, deps: Callable[[Run], Deps] | None = None) -> CaseResult:
    """Replay one case.

    1. Launch it as a scripted run (the case's task, approver, limits and script) under
       the case's profile or its scripted twin.
    2. Drive it; each time it waits for a human, apply the next recorded decision
       (its tool must match the pending call's).
    3. Check the expected end state, the budgets, the answer, the side effects and that
       no risky call ran after taint without approval.
    """
    if not isinstance(case, dict):
        return CaseResult(name, "?", problems=[str(case)])
    expect = case.get("expect") or {}
    result = CaseResult(name, str(expect.get("state", "?")))
    if "state" not in expect:
        result.problems.append("the case has no expect.state")
        return result
    local = case.get("requires_profile")
    if isinstance(local, str) and not AgentProfile.objects.filter(name=local).exists():
        result.problems.append(
            f"the case was saved from a run of {local!r}, an agent profile of the deployment that saved it, "
            "and this database has none: replay it there, or create the profile first"
        )
        return result
    try:
        run = run_launch(
            agent=replay_profile(str(case.get("agent") or "scripted")),
            task=case.get("task") or name,
            approver=case.get("approver") or engine_policy.HUMAN,
            limits=case.get("limits") or None,
            script=case.get("script") or [],
            policy=case.get("policy") or None,
        )
    except ActionError as exc:
        result.problems.append(f"launch refused: {exc.code}: {exc.detail}")
        return result
    decisions = [
        d for d in case.get("decisions") or [] if d.get("decision") in names.DECISIONS or d.get("expired")
    ]
    run = run_settle(run.pk, timeout=timeout, deps=deps)
    while run.state == states.AWAITING_APPROVAL:
        pending = run.pending_approval()
        if pending is None or not decisions:
            break  # the run waits for an answer the case does not give: reported below
        d = decisions.pop(0)
        if d.get("tool") not in (None, pending.tool) or ("args" in d and d["args"] != pending.args):
            # A decision answers one exact call; a replay that proposes another call
            # must not inherit it.
            result.problems.append(
                f"the recorded decision is for {d.get('tool')} {d.get('args')!r}, "
                f"but {pending.tool} {pending.args!r} is pending"
            )
            break
        problem = answer(pending, d)
        if problem:
            result.problems.append(problem)
            break
        run = run_settle(run.pk, timeout=timeout, deps=deps)
    result.run = run
    result.verdicts = [
        (str((t.payload.get("call") or {}).get("tool")), str(t.payload["verdict"].get("action")))
        for t in run.transitions.filter(payload__has_key="verdict").order_by("seq").only("payload")
    ]
    result.problems.extend(check(run, case, decisions_left=len(decisions)))
    return result


def answer(pending: Approval, d: dict[str, Any]) -> str | None:
    """Give the pending approval the recorded answer: let it expire, cast the recorded
    votes (the first with the edited arguments, if any) by the same names, or give the
    single decision. A problem when the replay cannot answer as the saved run did."""
    if d.get("expired"):
        if pending.expires_at is None:
            return "the recorded approval expired, but the replayed one has no expiry (approval_timeout_seconds)"
        approval_expire(approval_id=pending.pk, owner="evals", now=pending.expires_at.timestamp() + 1)
        return None
    edited = d.get("edited_args")
    votes = d.get("votes") or [{"by": "", "decision": d["decision"], "note": d.get("note") or ""}]
    # The recorded voters saw the call as it was then: the first one the agent's (they
    # edited it), the others the edited call.
    seen = pending.args_hash
    for i, vote in enumerate(votes):
        try:
            result = approval_decide(
                approval_id=pending.pk, user=None, voter=str(vote.get("by") or ""), decision=str(vote["decision"]),
                note=vote.get("note") or "", args=edited if i == 0 else None, args_hash=seen,
            )
        except ActionError as exc:
            return f"the recorded answer was refused: {exc.code}: {exc.detail}"
        if result.outcome == "decided":
            return None
        seen = result.approval.args_hash
    pending.refresh_from_db()
    if pending.is_pending:
        return f"the recorded {len(votes)} vote(s) do not decide the replayed approval (it needs {pending.required})"
    return None


def check(run: Run, case: dict[str, Any], *, decisions_left: int = 0) -> list[str]:
    expect = case.get("expect") or {}
    problems = []
    if run.state != expect["state"]:
        detail = f" ({run.error})" if run.error else ""
        problems.append(f"ended {run.state}{detail}, expected {expect['state']}")
    limits = run.engine.get("limits", {})
    for counter, limit in (("steps", "max_steps"), ("cost_micros", "max_cost_micros"), ("tokens", "max_tokens")):
        budget = (
            min(v for v in (limits.get(limit), expect.get(limit)) if v is not None)
            if (limits.get(limit) is not None or expect.get(limit) is not None)
            else None
        )
        if budget is not None and getattr(run, counter) > budget:
            problems.append(f"{counter} {getattr(run, counter)} over the budget {budget}")
    want = expect.get("answer")
    if isinstance(want, str) and run.answer != want:
        problems.append(f"answer {run.answer!r}, expected {want!r}")
    elif want is True and not (run.answer or "").strip():
        problems.append("no answer, expected one")
    if expect.get("error_contains") and expect["error_contains"] not in (run.error or ""):
        problems.append(f"error {run.error!r} does not mention {expect['error_contains']!r}")
    if "ledger_entries" in expect:
        n = side_effects(run, live=case.get("tools") == LIVE)
        if n != expect["ledger_entries"]:
            problems.append(f"{n} ledger entries (side effects), expected {expect['ledger_entries']}")
    if decisions_left:
        problems.append(f"{decisions_left} recorded decision(s) never used")
    problems.extend(trajectory_problems(run, expect.get("calls")))
    problems.extend(invariant_problems(run))
    return problems


def side_effects(run: Run, *, live: bool) -> int:
    """Live: the ledger rows the run's tools wrote. Replayed: the successful write and
    irreversible calls whose recorded results were returned, the effects the run would
    have had (nothing was written)."""
    if live:
        return int(LedgerEntry.objects.filter(run=run).count())
    reg = registry()
    n = 0
    for t in run.transitions.filter(kind="tool").order_by("seq").only("payload"):
        spec = reg.get(str((t.payload.get("call") or {}).get("tool", "")))
        if t.payload.get("ok") and not t.payload.get("replayed") and (spec is None or spec.risk in RISKY):
            n += 1
    return n


def trajectory(run: Run) -> list[dict[str, Any]]:
    """The calls the model proposed, in order: [{"tool", "args"}]."""
    calls = []
    for tool_calls in Message.objects.filter(run=run, role="assistant").order_by("index").values_list(
        "tool_calls", flat=True
    ):
        for c in tool_calls or ():
            calls.append({"tool": c.get("tool"), "args": c.get("args")})
    return calls


def _matches(expected: dict[str, Any], actual: dict[str, Any]) -> bool:
    if expected.get("tool") != actual.get("tool"):
        return False
    return "args" not in expected or canonical_json(expected["args"]) == canonical_json(actual.get("args"))


def _covered(wanted: list[dict[str, Any]], pool: list[dict[str, Any]], match: Callable[[Any, Any], bool]) -> list[dict[str, Any]]:
    """The calls of `wanted` left over after matching each to a distinct call of `pool`."""
    free = list(pool)
    missing = []
    for w in wanted:
        for i, p in enumerate(free):
            if match(w, p):
                del free[i]
                break
        else:
            missing.append(w)
    return missing


def trajectory_problems(run: Run, spec: Any) -> list[str]:
    """`expect.calls`: {"mode": strict|unordered|subset|superset, "calls": [{"tool",
    "args"?}]}, matched as agentevals' trajectory matchers do, on tool names and, where
    a reference call gives them, its arguments:

    - strict: the same calls in the same order;
    - unordered: the same calls in any order;
    - subset: every call the agent made is one of the reference's;
    - superset: every reference call was made (others may be too).
    """
    if spec is None:
        return []
    if not isinstance(spec, dict) or spec.get("mode") not in MATCH_MODES or not isinstance(spec.get("calls"), list) or not all(
        isinstance(c, dict) and isinstance(c.get("tool"), str) for c in spec["calls"]
    ):
        return [f'expect.calls must be {{"mode": {"|".join(MATCH_MODES)}, "calls": [{{"tool", "args"?}}]}}']
    mode, reference = spec["mode"], spec["calls"]
    actual = trajectory(run)

    def show(calls: list[dict[str, Any]]) -> str:
        return ", ".join(c["tool"] + (f" {canonical_json(c['args'])}" if "args" in c else "") for c in calls) or "none"

    if mode == "strict":
        if len(actual) != len(reference) or not all(_matches(r, a) for r, a in zip(reference, actual, strict=False)):
            return [f"trajectory (strict): the agent called {show(actual)}; expected {show(reference)}"]
        return []
    missing = _covered(reference, actual, _matches)  # reference calls not made
    extra = _covered(actual, reference, lambda a, r: _matches(r, a))  # calls not in the reference
    problems = []
    if mode in ("unordered", "superset") and missing:
        problems.append(f"trajectory ({mode}): expected calls not made: {show(missing)}")
    if mode in ("unordered", "subset") and extra:
        problems.append(f"trajectory ({mode}): calls not in the reference: {show(extra)}")
    return problems


def invariant_problems(run: Run) -> list[str]:
    """What must hold whatever the model does, each problem naming its invariant:

    - intent_before_effect: every executed call has its journal (intent) row, and every
      side-effect row names a journalled key;
    - one_execution_per_key: no idempotency key executed twice, no key with two effects;
    - no_write_after_taint_without_approval: see `unapproved_risky_calls`;
    - budget: steps, cost and tokens within the run's limits.
    """
    problems = []
    journal = dict(ToolCall.objects.filter(run=run).values_list("call_id", "idempotency_key"))
    keys = set(journal.values())
    executions: dict[str, int] = {}
    for t in run.transitions.filter(kind="tool").order_by("seq").only("seq", "payload"):
        call_id = str((t.payload.get("call") or {}).get("id"))
        if call_id not in journal:
            problems.append(f"invariant intent_before_effect: transition {t.seq} ran {call_id} with no journal row")
        elif not t.payload.get("replayed"):
            executions[journal[call_id]] = executions.get(journal[call_id], 0) + 1
    effects: dict[str, int] = {}
    for key in LedgerEntry.objects.filter(run=run).exclude(idempotency_key=None).values_list("idempotency_key", flat=True):
        effects[key] = effects.get(key, 0) + 1
        if key not in keys:
            problems.append(f"invariant intent_before_effect: a ledger entry names key {key[:12]}... with no intent row")
    for what, counts in (("executed", executions), ("has ledger entries", effects)):
        for key, n in sorted(counts.items()):
            if n > 1:
                problems.append(f"invariant one_execution_per_key: key {key[:12]}... {what} {n} times")
    problems.extend(f"invariant no_write_after_taint_without_approval: {p}" for p in unapproved_risky_calls(run))
    limits = (run.engine or {}).get("limits", {})
    for counter, limit in (("steps", "max_steps"), ("cost_micros", "max_cost_micros"), ("tokens", "max_tokens")):
        if limits.get(limit) is not None and getattr(run, counter) > limits[limit]:
            problems.append(f"invariant budget: {counter} {getattr(run, counter)} over the run's {limit} {limits[limit]}")
    return problems
