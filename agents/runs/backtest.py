"""Policy from evidence: what a proposed policy would have done to recorded calls.

Every call a run proposed is in its history: the transition that judged it (its
payload's `verdict`, and a JSON merge patch from which the engine state before it is
rebuilt, taint and grants included), the arguments (the assistant message that proposed
them) and, when it asked, how reviewers answered (the approval). A backtest judges each
such call again with `engine.policy.verdict`, the one judge the engine uses, under the
proposed policy and the state the run had then, and compares. It reads history only.

Shadow rules' agreement with what happened is read from the same transitions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse
from django.utils import timezone

from agents.engine import decisions, patch, policy
from agents.engine.fingerprints import fingerprint
from agents.engine.history import Answer
from agents.engine.planning import verdict_for
from agents.engine.policy import PolicyError, Verdict
from agents.engine.registry import Registry
from agents.engine.run import RunState
from agents.models import AgentProfile, Approval, Message, Run, Transition
from agents.runs.history import StoreHistory
from agents.tools import registry as tool_registry

PROPOSAL_KEYS = ("rules", "always_ask_tools", "denied_tools", "irreversible_approvals")
# The classes of change a report counts, in the order it shows them.
CLASSES = ("allow->ask", "ask->allow", "allow->deny", "ask->deny", "deny->allow", "deny->ask", "votes_up", "votes_down")
CLASS_LABELS = {
    "allow->ask": "would ask where it allowed",
    "ask->allow": "would let through without asking",
    "allow->deny": "would deny where it allowed",
    "ask->deny": "would deny where it asked",
    "deny->allow": "would allow where it denied",
    "deny->ask": "would ask where it denied",
    "votes_up": "would need more votes",
    "votes_down": "would need fewer votes",
}
DEFAULT_DAYS = 30
MAX_DAYS = 3650


def validate_proposal(data: Any) -> dict[str, Any]:
    """The proposed policy fields, validated as a profile's are; PolicyError names the
    first bad field. It may loosen as well as tighten: it is a profile edit to try."""
    if not isinstance(data, dict):
        raise PolicyError(
            "policy", 'must be an object: {"rules", "always_ask_tools"?, "denied_tools"?, "irreversible_approvals"?}'
        )
    unknown = sorted(set(data) - set(PROPOSAL_KEYS))
    if unknown:
        raise PolicyError(unknown[0], f"unknown key (a proposal takes {', '.join(PROPOSAL_KEYS)})")
    if "rules" not in data:
        raise PolicyError("rules", "is required (an empty list tries the policy without rules)")
    clean: dict[str, Any] = {"rules": policy.validate_rules(data["rules"])}
    for name in ("always_ask_tools", "denied_tools"):
        if name in data:
            names = data[name]
            if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                raise PolicyError(name, "must be a list of tool names")
            clean[name] = names
    if "irreversible_approvals" in data:
        policy.validate_settings({"irreversible_approvals": data["irreversible_approvals"]})
        clean["irreversible_approvals"] = data["irreversible_approvals"]
    return clean


@dataclass
class RecordedCall:
    """One proposed call as history has it, with the engine state just before it."""

    run: Run
    seq: int
    tool: str
    args: Any
    state: RunState
    recorded: dict[str, Any]  # the payload's verdict
    approval: Approval | None
    at: dt.datetime | None = None  # when it was judged: history rules see the calls before

    @property
    def outcome(self) -> str:
        """What happened to it: allowed, denied, or the approval's status."""
        if self.approval is not None and self.recorded.get("action") == "ask":
            return str(self.approval.status)
        return {"allow": "allowed", "deny": "denied"}.get(self.recorded.get("action", ""), "")


def recorded_calls(runs: Any) -> Iterator[RecordedCall]:
    """Every call the runs proposed that policy judged, oldest run first, in order."""
    for run in runs:
        approvals = {a.call_id: a for a in Approval.objects.filter(run=run, kind=Approval.Kind.POLICY)}
        # A call's arguments live once, in the assistant message that proposed it.
        proposed: dict[str, list[tuple[int, Any]]] = {}
        for seq, tool_calls in (
            Message.objects.filter(run=run).exclude(tool_calls=None).order_by("index").values_list("seq", "tool_calls")
        ):
            for c in tool_calls or ():
                if isinstance(c, dict) and "id" in c:
                    proposed.setdefault(c["id"], []).append((seq, c.get("args")))
        engine: dict[str, Any] = {}
        for t in run.transitions.order_by("seq").only("seq", "payload", "created_at").iterator():
            payload = t.payload or {}
            before = engine
            engine = patch.apply(engine, payload.get("patch", {}))
            verdict, call = payload.get("verdict"), payload.get("call")
            if not isinstance(verdict, dict) or not isinstance(call, dict):
                continue
            candidates = [args for seq, args in proposed.get(str(call.get("id")), []) if seq <= t.seq]
            if not candidates:
                continue
            yield RecordedCall(
                run=run,
                seq=t.seq,
                tool=call.get("tool", ""),
                args=candidates[-1],
                state=RunState.from_json(before),
                recorded=verdict,
                approval=approvals.get(call.get("id")),
                at=t.created_at,
            )


def judge(state: RunState, registry: Registry, tool: str, args: Any, history: Answer | None = None) -> Verdict:
    """The verdict the engine gives this call in this state: the engine's own judge.
    `history`: the figures of history rules, as they stood when the call was judged."""
    spec = registry.get(tool) if (state.tools is None or tool in state.tools) else None
    return verdict_for(state, spec, tool, args, fingerprint(tool, args), history)


def history_then(call: RecordedCall) -> Answer:
    """History as it stood just before `call` was judged: the calls counted then (made
    before it, and waiting then or run), not those that came after."""
    return StoreHistory(call.run, as_of=call.at).figures


def under(state: RunState, proposal: dict[str, Any]) -> RunState:
    """The state as it would have been had the run launched under the proposed profile
    policy: its launch rules stay first, the profile's rules are the proposal's."""
    tried = state.copy()
    pol = policy.effective(state.policy)
    launch = [r for r in pol["rules"] if r.get("origin") == "launch"]
    profile = [{**r, "origin": "profile", "index": i} for i, r in enumerate(proposal["rules"], 1)]
    tried.policy = {**pol, "rules": [*launch, *profile]}
    if "irreversible_approvals" in proposal:
        tried.policy["irreversible_approvals"] = proposal["irreversible_approvals"]
    if "denied_tools" in proposal:
        tried.denied_tools = list(proposal["denied_tools"])
    if "always_ask_tools" in proposal:
        tried.always_ask_tools = list(proposal["always_ask_tools"])
    return tried


@dataclass
class Change:
    call: RecordedCall
    before: dict[str, Any]
    after: Verdict

    @property
    def approval_url(self) -> str:
        if self.call.approval is None:
            return ""
        return str(reverse("reviews:approval", args=[self.call.approval.pk]))

    def to_dict(self) -> dict[str, Any]:
        approval = self.call.approval
        return {
            "run": self.call.run.pk,
            "seq": self.call.seq,
            "tool": self.call.tool,
            "args": self.call.args,
            "was": self.before.get("action"),
            "would_be": self.after.action,
            "required_was": self.before.get("required", 1),
            "required_would_be": self.after.required,
            "reason": self.after.reason,
            "approval": approval.pk if approval else None,
            "outcome": self.call.outcome,
            "url": self.approval_url,
        }


@dataclass
class Report:
    profile: str
    days: int
    since: dt.datetime
    calls: int = 0
    changes: dict[str, list[Change]] = field(default_factory=dict)
    # The proposal's shadow rules on the same calls: how each would have agreed.
    shadow: list[Agreement] = field(default_factory=list)
    # Calls in the window that could not be judged again: their runs were purged by
    # retention, which forgot the arguments and the state each call was judged in.
    unjudged: int = 0
    purged_runs: int = 0

    def unjudged_text(self) -> str:
        """'13 calls in the window could not be judged: their 4 runs were purged ...', or ''."""
        if not self.unjudged:
            return ""
        calls = f"{self.unjudged} call{'' if self.unjudged == 1 else 's'}"
        runs = f"{self.purged_runs} run{'' if self.purged_runs == 1 else 's'}"
        return (
            f"{calls} in the window could not be judged: {'its' if self.unjudged == 1 else 'their'} {runs} "
            f"{'was' if self.purged_runs == 1 else 'were'} purged by retention, which keeps the decision "
            "record but not the arguments or the state each call was judged in"
        )

    def answers(self, cls: str) -> dict[str, list[int]]:
        """How reviewers answered the calls of a class that asked: status -> approval ids."""
        out: dict[str, list[int]] = {}
        for change in self.changes.get(cls, ()):
            if change.before.get("action") == "ask" and change.call.approval is not None:
                out.setdefault(change.call.outcome, []).append(change.call.approval.pk)
        return out

    def summary(self, cls: str) -> str:
        """'47 calls would let through without asking; reviewers approved 46 and rejected 1: #812'."""
        n = len(self.changes.get(cls, ()))
        text = f"{cls}: {n} call{'' if n == 1 else 's'} {CLASS_LABELS[cls]}"
        answers = self.answers(cls)
        if answers:
            parts = []
            for status in (decisions.APPROVED, decisions.REJECTED, decisions.EXPIRED, decisions.PENDING):
                ids = answers.get(status, [])
                if not ids:
                    continue
                part = f"{status} {len(ids)}"
                if status == decisions.REJECTED:
                    part += ": " + ", ".join(f"#{i}" for i in ids[:20]) + (" ..." if len(ids) > 20 else "")
                parts.append(part)
            text += "; reviewers " + ", ".join(parts)
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "days": self.days,
            "since": self.since.isoformat(),
            "calls": self.calls,
            "unjudged": {"calls": self.unjudged, "purged_runs": self.purged_runs, "why": self.unjudged_text()},
            "changed": {cls: len(self.changes.get(cls, ())) for cls in CLASSES},
            "answers": {cls: self.answers(cls) for cls in CLASSES if self.answers(cls)},
            "calls_changed": {
                cls: [c.to_dict() for c in self.changes[cls]] for cls in CLASSES if self.changes.get(cls)
            },
            "shadow": [
                {"rule": a.rule, "agreed": a.agreed, "disagreed": a.disagreed, "undecided": a.undecided}
                for a in self.shadow
            ],
        }


def change_class(before: dict[str, Any], after: Verdict) -> str | None:
    was, now = before.get("action"), after.action
    if was != now:
        return f"{was}->{now}"
    if was == "ask":
        required = before.get("required", 1)
        if after.required > required:
            return "votes_up"
        if after.required < required:
            return "votes_down"
    return None


def backtest(
    profile: AgentProfile,
    proposal: dict[str, Any],
    *,
    days: int = DEFAULT_DAYS,
    now: dt.datetime | None = None,
    registry: Registry | None = None,
) -> Report:
    """Every call proposed under `profile` in the last `days`, judged again under the
    proposal; the report lists those whose verdict would change. Reads only."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise PolicyError("days", f"must be a whole number of days from 1 to {MAX_DAYS}")
    proposal = validate_proposal(proposal)
    since = (now or timezone.now()) - dt.timedelta(days=days)
    reg = registry or tool_registry()
    report = Report(profile=profile.name, days=days, since=since)
    window = Run.objects.filter(profile=profile, created_at__gte=since)
    runs = window.filter(purged_at=None).order_by("pk")
    purged = window.exclude(purged_at=None)
    report.purged_runs = purged.count()
    if report.purged_runs:
        # A tombstone keeps each transition's skeleton: the ones that judged a proposed
        # call still name it (`call`), from planning, though their verdict is gone.
        report.unjudged = Transition.objects.filter(
            run__in=purged, from_state="planning", payload__has_key="call"
        ).count()
    shadows: dict[int, Agreement] = {}
    for call in recorded_calls(runs.iterator()):
        report.calls += 1
        after = judge(under(call.state, proposal), reg, call.tool, call.args, history_then(call))
        cls = change_class(call.recorded, after)
        if cls is not None:
            report.changes.setdefault(cls, []).append(Change(call, call.recorded, after))
        _tally(shadows, after.shadow, call)
    report.shadow = [shadows[n] for n in sorted(shadows)]
    return report


# -- shadow rules' agreement ---------------------------------------------------------------


@dataclass
class Agreement:
    rule: int
    agreed: int = 0
    disagreed: int = 0
    undecided: int = 0  # still pending, expired: nobody said

    @property
    def rate(self) -> float | None:
        n = self.agreed + self.disagreed
        return None if n == 0 else self.agreed / n


def agrees(shadow: str, outcome: str, recorded: str) -> bool | None:
    """Whether a shadow verdict agrees with what happened; None when nobody decided.

    allow agrees with a call that ran (allowed, or approved by reviewers); deny with a
    call that did not (denied, rejected); ask with a call that was put to a human.
    """
    if outcome in (decisions.PENDING, decisions.EXPIRED, ""):
        return None
    if shadow == "ask":
        return recorded == "ask"
    if shadow == "allow":
        return outcome in ("allowed", decisions.APPROVED)
    return outcome in (decisions.DENIED, decisions.REJECTED)


def shadow_agreement(
    profile: AgentProfile, *, days: int = DEFAULT_DAYS, now: dt.datetime | None = None
) -> list[Agreement]:
    """Each shadow rule's agreement with what the enforced policy and reviewers did."""
    since = (now or timezone.now()) - dt.timedelta(days=days)
    by_rule: dict[int, Agreement] = {}
    runs = Run.objects.filter(profile=profile, created_at__gte=since).order_by("pk")
    for call in recorded_calls(runs.iterator()):
        _tally(by_rule, call.recorded.get("shadow") or (), call)
    return [by_rule[n] for n in sorted(by_rule)]


def _tally(by_rule: dict[int, Agreement], shadow: Any, call: RecordedCall) -> None:
    """Count each shadow verdict on `call` (recorded, or a proposal's) against what happened."""
    for entry in shadow:
        n = entry.get("rule")
        if not isinstance(n, int):
            continue
        tally = by_rule.setdefault(n, Agreement(n))
        verdict = agrees(entry.get("verdict", ""), call.outcome, call.recorded.get("action", ""))
        if verdict is None:
            tally.undecided += 1
        elif verdict:
            tally.agreed += 1
        else:
            tally.disagreed += 1
