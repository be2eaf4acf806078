"""Evals from saved runs: replay a case (the export format) with the scripted model and
check what must hold whatever the model says.

A case is a JSON object with `agent`, `task`, `approver`, `limits`, `policy` (what the
launch added to the profile's), `script`, `decisions` (the reviewers' answers, in order:
each with its `decision`, or its `votes` and `edited_args`, or `expired`) and `expect`
(`state`, `answer`, and optionally `error_contains`, `ledger_entries`, `max_steps`,
`max_cost_micros`, `max_tokens`).
`manage.py export_run ID` writes one; `evals/` holds hand-written ones.

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

from agents.actions import ActionError, approval_decide, approval_expire, run_launch
from agents.engine import decisions as names
from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.protocols import Deps, ThreadRunner
from agents.models import AgentProfile, Approval, LedgerEntry, Run
from agents.runs import driver, store

RISKY = ("write", "irreversible")


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
    from agents.tools import registry

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


def eval_deps(run: Run) -> Deps:
    return dataclasses.replace(driver.deps_for(run), runner=SameConnectionRunner())


def run_isolated(name: str, case: Any, *, timeout: float = 60.0, keep: bool = False) -> CaseResult:
    """Replay one case in a transaction rolled back at the end (`keep`: committed, to
    look at the runs in the dashboard; never on a deployment). What the result holds
    (the run, its counters) is read before the rollback.

    On SQLite the transaction holds the write lock while the case replays (a second,
    as a rule): the web and the worker wait behind the busy timeout meanwhile.
    """
    # Email goes to memory: an approved send_email in a case must not reach anyone.
    with override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend"), transaction.atomic():
        result = run_case(name, case, timeout=timeout, deps=eval_deps)
        if not keep:
            transaction.set_rollback(True)
    return result


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
        n = LedgerEntry.objects.filter(run=run).count()
        if n != expect["ledger_entries"]:
            problems.append(f"{n} ledger entries (side effects), expected {expect['ledger_entries']}")
    if decisions_left:
        problems.append(f"{decisions_left} recorded decision(s) never used")
    problems.extend(unapproved_risky_calls(run))
    return problems
