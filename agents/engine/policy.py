"""The action policy: allow, ask or deny a proposed call, with a reason.

Argument rules are data an operator writes (`AgentProfile.rules`, tighter ones given at
launch). This module validates them (the one validator the admin, the API and the
launch form share), snapshots them into a run, and evaluates them on a call's
arguments after its schema was validated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from . import history as history_mod
from .conditions import (
    PolicyError as PolicyError,  # the policy's error, defined where conditions (below the policy) raise it too
)
from .conditions import Unevaluable, holds, validate_condition
from .registry import ToolSpec
from .text import ONE_LINE_MAX, one_line

Action = Literal["allow", "ask", "deny"]

THEN = ("allow", "ask", "deny")
ON_EXPIRY = ("reject", "fail")
# Who may approve a run's asks: a human reviewer, or nobody (every "ask" becomes a
# recorded denial). The one list; the API's Literal is held to it by a test.
HUMAN = "human"
NO_APPROVER = "none"
APPROVERS = (HUMAN, NO_APPROVER)
RULE_KEYS = frozenset({"tool", "when", "then", "approvals", "reason", "step_up", "mode", "history"})
# A rule's mode: "enforce" (the default) decides; "shadow" is evaluated on every call
# and what it would have decided is recorded, but it decides nothing.
ENFORCE = "enforce"
SHADOW = "shadow"
MODES = (ENFORCE, SHADOW)
MAX_APPROVALS = 10

# What a run's policy holds when nothing says otherwise (also a run launched before
# policies were snapshotted: it had no rules then, so it has none now).
DEFAULT_POLICY: dict[str, Any] = {
    "rules": [],
    "irreversible_approvals": 1,
    "separate_duties": False,
    "approval_timeout_seconds": None,
    "on_expiry": "reject",
}


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    no_approver: bool = False  # an "ask" turned into "deny" because nobody may approve
    rule: dict[str, Any] | None = None  # the rule that decided, as snapshotted (origin, index)
    required: int = 1  # votes an "ask" needs
    grant: int | None = None  # the run-scoped grant that let an "ask" through
    # What each matching shadow rule would have decided: [{"rule": index, "verdict"}].
    shadow: tuple[dict[str, Any], ...] = ()
    # The deciding rule's history figures, as the reviewer reads them (history.Reading).
    history: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"action": self.action, "reason": self.reason}
        if self.rule is not None:
            data["rule"] = self.rule
        if self.required != 1:
            data["required"] = self.required
        if self.grant is not None:
            data["grant"] = self.grant
        if self.shadow:
            data["shadow"] = [dict(s) for s in self.shadow]
        if self.history is not None:
            data["history"] = dict(self.history)
        return data


# -- validation ----------------------------------------------------------------------


def validate_rules(rules: Any, *, field: str = "rules", launch: bool = False) -> list[dict[str, Any]]:
    """The rules as a list of plain dicts, or PolicyError naming the first bad field.

    Launch rules may only tighten, so they may only say `ask` or `deny`.
    """
    if not isinstance(rules, list):
        raise PolicyError(field, "must be a list of rules")
    return [validate_rule(rule, field=f"{field}[{i}]", launch=launch) for i, rule in enumerate(rules, 1)]


def validate_rule(rule: Any, *, field: str, launch: bool = False) -> dict[str, Any]:
    if not isinstance(rule, dict):
        raise PolicyError(field, "a rule is an object with tool, then and reason (when and approvals optional)")
    unknown = sorted(set(rule) - RULE_KEYS)
    if unknown:
        raise PolicyError(f"{field}.{unknown[0]}", f"unknown key (a rule takes {', '.join(sorted(RULE_KEYS))})")
    tool = rule.get("tool")
    if not isinstance(tool, str) or not tool.strip():
        raise PolicyError(f"{field}.tool", 'must be a tool name or "*"')
    then = rule.get("then")
    allowed = ("ask", "deny") if launch else THEN
    if then not in allowed:
        extra = " (launch rules only tighten)" if launch else ""
        raise PolicyError(f"{field}.then", f"must be {_either(allowed)}{extra}, not {then!r}")
    reason = rule.get("reason")
    if not isinstance(reason, str) or not one_line(reason):
        raise PolicyError(f"{field}.reason", "must be a short text the reviewer reads")
    if "approvals" in rule:
        n = rule["approvals"]
        if then != "ask":
            raise PolicyError(f"{field}.approvals", "only an ask rule takes approvals")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_APPROVALS:
            raise PolicyError(f"{field}.approvals", f"must be a whole number from 1 to {MAX_APPROVALS}")
    if "step_up" in rule and (rule["step_up"] is not True and rule["step_up"] is not False or then != "ask"):
        # An emailed link alone may not decide what this rule asks: the reviewer logs in.
        raise PolicyError(f"{field}.step_up", "true or false, and only on an ask rule")
    if "when" in rule:
        validate_condition(rule["when"], field=f"{field}.when")
    if "history" in rule:
        try:
            history = history_mod.validate(rule["history"])
        except history_mod.HistoryError as exc:
            raise PolicyError(f"{field}.{exc.field}", exc.message) from None
    mode = rule.get("mode", ENFORCE)
    if mode not in MODES:
        raise PolicyError(f"{field}.mode", f"must be {_either(MODES)}, not {mode!r}")
    if mode == SHADOW and launch:
        raise PolicyError(f"{field}.mode", "a launch rule cannot be a shadow rule (shadow rules belong to the profile)")
    # The reason reaches notifications as one line of theirs: one line, capped.
    kept = ("tool", "when", "then", "approvals", "step_up")
    clean = {**{k: rule[k] for k in kept if k in rule}, "reason": one_line(reason)}
    if "history" in rule:
        clean["history"] = history
    if mode == SHADOW:
        clean["mode"] = SHADOW
    return clean


def check_rule_tools(rules: list[dict[str, Any]], offered: Iterable[str], *, field: str = "rules") -> None:
    """PolicyError for the first rule naming a tool the agent is not offered: such a rule
    could never match, and a reviewer relying on it would be protected by nothing.

    `offered` holds tool names and `PREFIX__*` patterns (all of an MCP server's tools);
    a rule for `"*"` names every tool."""
    names = set(offered)
    prefixes = tuple(n[:-1] for n in names if n.endswith("__*"))
    for i, rule in enumerate(rules, 1):
        tool = rule["tool"]
        if tool == "*" or tool in names or (prefixes and tool.startswith(prefixes)):
            continue
        shown = ", ".join(sorted(names)) or "none"
        raise PolicyError(f"{field}[{i}].tool", f"the agent has no tool named {tool!r} (its tools: {shown})")


def _either(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]


def validate_settings(data: dict[str, Any], *, field: str = "") -> None:
    """The non-rule policy fields, each only if present."""
    prefix = f"{field}." if field else ""
    if "irreversible_approvals" in data:
        n = data["irreversible_approvals"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_APPROVALS:
            raise PolicyError(f"{prefix}irreversible_approvals", f"must be a whole number from 1 to {MAX_APPROVALS}")
    if "separate_duties" in data and not isinstance(data["separate_duties"], bool):
        raise PolicyError(f"{prefix}separate_duties", "must be true or false")
    if "approval_timeout_seconds" in data:
        n = data["approval_timeout_seconds"]
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise PolicyError(f"{prefix}approval_timeout_seconds", "must be a whole number of seconds (at least 1) or null")
    if "on_expiry" in data and data["on_expiry"] not in ON_EXPIRY:
        raise PolicyError(f"{prefix}on_expiry", f"must be {_either(ON_EXPIRY)}")


# -- the snapshot a run keeps ---------------------------------------------------------

LAUNCH_KEYS = ("rules", "irreversible_approvals", "separate_duties", "approval_timeout_seconds")


def snapshot(profile: dict[str, Any], launch: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's policy: the profile's, tightened by what was given at launch.

    Launch rules come first (origin "launch"), then the profile's (origin "profile"),
    each with its 1-based index within its origin. Anything looser than the profile is
    a PolicyError naming the field under `policy.`.
    """
    base = {**DEFAULT_POLICY, **{k: v for k, v in profile.items() if k in DEFAULT_POLICY}}
    # A profile saved around its validation (a bulk update) must not launch runs.
    base["rules"] = validate_rules(base["rules"] or [], field="profile.rules")
    validate_settings(base, field="profile")
    launch = {} if launch is None else launch
    if not isinstance(launch, dict):
        raise PolicyError("policy", "must be an object")
    unknown = sorted(set(launch) - set(LAUNCH_KEYS))
    if unknown:
        raise PolicyError(f"policy.{unknown[0]}", f"unknown key (a launch policy takes {', '.join(LAUNCH_KEYS)})")
    validate_settings(launch, field="policy")
    launch_rules = validate_rules(launch.get("rules", []), field="policy.rules", launch=True)
    result = dict(base)
    n = launch.get("irreversible_approvals")
    if n is not None:
        if n < base["irreversible_approvals"]:
            raise PolicyError(
                "policy.irreversible_approvals", f"may only rise from the profile's {base['irreversible_approvals']}"
            )
        result["irreversible_approvals"] = n
    if "separate_duties" in launch:
        if base["separate_duties"] and not launch["separate_duties"]:
            raise PolicyError("policy.separate_duties", "the profile separates duties; a launch may not turn that off")
        result["separate_duties"] = base["separate_duties"] or launch["separate_duties"]
    timeout = launch.get("approval_timeout_seconds")
    if timeout is not None:
        mine = base["approval_timeout_seconds"]
        if mine is not None and timeout > mine:
            raise PolicyError("policy.approval_timeout_seconds", f"may only shorten the profile's {mine} s")
        result["approval_timeout_seconds"] = timeout
    result["rules"] = [
        *({**r, "origin": "launch", "index": i} for i, r in enumerate(launch_rules, 1)),
        *({**r, "origin": "profile", "index": i} for i, r in enumerate(base["rules"], 1)),
    ]
    return result


def effective(policy: dict[str, Any] | None) -> dict[str, Any]:
    """A run's snapshot with every key present."""
    return {**DEFAULT_POLICY, **(policy or {})}


def rule_label(rule: dict[str, Any]) -> str:
    """'rule 2 of the profile', 'rule 1 of the launch policy'."""
    where = "the launch policy" if rule.get("origin") == "launch" else "the profile"
    return f"rule {rule.get('index', '?')} of {where}"


WOULD = {"allow": "would have allowed this", "ask": "would have asked a human", "deny": "would have denied this"}


def shadow_label(entry: Any) -> str:
    """'shadow rule 3 would have allowed this', for one of a verdict's `shadow` entries."""
    if not isinstance(entry, dict):
        return ""
    would = WOULD.get(str(entry.get("verdict")), "would have decided otherwise")
    return f"shadow rule {entry.get('rule', '?')} {would}"


# -- the verdict ---------------------------------------------------------------------


def verdict(
    spec: ToolSpec | None,
    tool: str,
    *,
    denied: list[str],
    always_ask: list[str],
    tainted: bool,
    approver: str,
    args: Any = None,
    policy: dict[str, Any] | None = None,
    grants: list[dict[str, Any]] | None = None,
    fingerprint: str = "",
    history: history_mod.Answer | None = None,
) -> Verdict:
    """The design's order: profile deny, the first matching rule, irreversible or
    always-ask, tainted write, allow. Taint wins over an allow rule and over a grant;
    a run-scoped grant turns an ask it covers into allow (see `grant_refusal`).

    A tool missing from the registry counts as irreversible and external. Shadow rules
    decide nothing; the verdict lists what each one that matches the call would have
    decided had it been enforced in its place (`Verdict.shadow`).

    A rule with `history` matches only if its history condition holds too: `history`
    answers the queries of every such rule whose tool and condition match, all at
    once (so the store can lock what they count together); without it, or for a call
    its query cannot be asked of, the rule fails closed.
    """
    pol = effective(policy)
    kwargs: dict[str, Any] = dict(
        denied=denied, always_ask=always_ask, tainted=tainted, approver=approver, args=args, grants=grants,
        fingerprint=fingerprint, facts=_history_facts(pol["rules"], tool, args, history),
    )
    verdict = _decide(spec, tool, policy=pol, **kwargs)
    shadows = []
    for i, rule in enumerate(pol["rules"]):
        if rule.get("mode") != SHADOW or _first(pol["rules"][i : i + 1], tool, args, kwargs["facts"], shadow=True) is None:
            continue
        enforced = {k: v for k, v in rule.items() if k != "mode"}
        promoted = [*pol["rules"][:i], enforced, *pol["rules"][i + 1 :]]
        facts = kwargs["facts"]
        if _rule_key(rule) in facts:
            facts = {**facts, _rule_key(enforced): facts[_rule_key(rule)]}
        what_if = _decide(spec, tool, policy={**pol, "rules": promoted}, **{**kwargs, "facts": facts})
        shadows.append({"rule": rule.get("index", i + 1), "verdict": what_if.action})
    if not shadows:
        return verdict
    return dataclasses.replace(verdict, shadow=tuple(shadows))


def _decide(
    spec: ToolSpec | None,
    tool: str,
    *,
    denied: list[str],
    always_ask: list[str],
    tainted: bool,
    approver: str,
    args: Any,
    policy: dict[str, Any],
    grants: list[dict[str, Any]] | None,
    fingerprint: str,
    facts: Facts,
) -> Verdict:
    risk = spec.risk if spec else "irreversible"
    pol = effective(policy)
    if tool in denied:
        return Verdict("deny", f"the agent profile denies the tool {tool}")
    verdict: Verdict | None = None
    rule = _first(pol["rules"], tool, args, facts)
    taint_asks = tainted and risk in ("write", "irreversible")
    if rule is not None:
        why, figures = _why(rule, tool, args, facts)
        if rule["then"] == "deny":
            return Verdict("deny", why, rule=rule, history=figures)
        if rule["then"] == "ask":
            # An ask rule never lowers the votes an irreversible call needs anyway.
            floor = pol["irreversible_approvals"] if risk == "irreversible" else 1
            verdict = Verdict("ask", why, rule=rule, required=max(rule.get("approvals", 1), floor), history=figures)
        elif not taint_asks:
            return Verdict("allow", why, rule=rule, history=figures)
    if verdict is None:
        verdict = _default(tool, risk, tainted, always_ask, pol["irreversible_approvals"], rule)
    if verdict is None:
        return Verdict("allow", f"{tool} is {risk}" + (" (run tainted)" if tainted else ""))
    grant = next((g for g in grants or () if grant_covers(g, tool, fingerprint)), None)
    if grant is not None and grant_refusal(risk=risk, required=verdict.required, tainted=tainted) is None:
        how = "this exact call" if "fp" in grant else f"any {tool} call"
        asked = f"{rule_label(verdict.rule)}: {verdict.reason}" if verdict.rule else verdict.reason
        reason = f"grant {grant['n']} by {grant.get('by') or 'a reviewer'} allows {how} for this run (else: {asked})"
        return Verdict("allow", reason, rule=verdict.rule, grant=grant["n"])
    if approver == NO_APPROVER:
        return Verdict(
            "deny", f"{verdict.reason}, and the run has no approver", no_approver=True,
            rule=verdict.rule, required=verdict.required, history=verdict.history,
        )
    return verdict


def _default(
    tool: str, risk: str, tainted: bool, always_ask: list[str], irreversible_approvals: int, allowing: dict[str, Any] | None
) -> Verdict | None:
    """The risk defaults (design steps 2-4), or None for allow. `allowing` is an allow
    rule that matched: only taint may overrule it."""
    required = irreversible_approvals if risk == "irreversible" else 1
    if allowing is not None:
        what = "writes" if risk == "write" else "is irreversible"
        reason = f"{tool} {what} and the run has read external content ({rule_label(allowing)} would allow it, but taint wins)"
        return Verdict("ask", reason, required=required)
    if risk == "irreversible":
        return Verdict("ask", f"{tool} is irreversible", required=required)
    if tool in always_ask:
        return Verdict("ask", f"the agent profile always asks before {tool}")
    if risk == "write" and tainted:
        return Verdict("ask", f"{tool} writes and the run has read external content")
    return None


def grant_refusal(*, risk: str, required: int, tainted: bool, kind: str = "policy") -> str | None:
    """Why a run-scoped grant may not be made (or used) for such a call, or None.

    Never for irreversible tools or approvals needing several votes, and never stronger
    than taint: a write or irreversible call in a tainted run always asks.
    """
    if kind != "policy":
        return "only a policy approval can be remembered"
    if risk == "irreversible":
        return "irreversible calls are approved one at a time"
    if required > 1:
        return f"this call needs {required} approvals; a grant would skip them"
    if tainted and risk == "write":
        return "the run has read external content, so every write asks"
    return None


def grant_covers(grant: dict[str, Any], tool: str, fingerprint: str) -> bool:
    if grant.get("revoked") or grant.get("tool") != tool:
        return False
    return "fp" not in grant or grant["fp"] == fingerprint


def first_match(
    rules: list[dict[str, Any]], tool: str, args: Any, history: history_mod.Answer | None = None
) -> dict[str, Any] | None:
    """The first enforced rule whose tool and condition match; fail closed on what
    cannot be evaluated: such a condition matches an ask or deny rule and not an allow
    rule. Shadow rules are skipped: they decide nothing."""
    return _first(rules, tool, args, _history_facts(rules, tool, args, history))


# A history rule's query and what it found, by `_rule_key`; None: it cannot be asked.
Facts = dict[int, "tuple[history_mod.Query, history_mod.Figures] | None"]


def _rule_key(rule: dict[str, Any]) -> int:
    # The rule object itself: a judgement asks and matches the same rules (`effective`
    # shares them), and a shadow rule promoted in its place (`verdict`) is given its
    # original's facts. (It was the rule's repr: asked three times a rule, that was a
    # third of judging a call under five history rules.)
    return id(rule)


def _when_matches(rule: dict[str, Any], args: Any) -> bool:
    if "when" not in rule:
        return True
    try:
        return holds(rule["when"], args)
    except (Unevaluable, KeyError, TypeError, ValueError, AttributeError):
        # Also a rule that slipped past validation (a hand-edited snapshot).
        return bool(rule["then"] != "allow")


def _history_facts(
    rules: list[dict[str, Any]], tool: str, args: Any, history: history_mod.Answer | None
) -> Facts:
    """The figures of every history rule whose tool and condition match this call,
    asked of `history` in one batch."""
    facts: Facts = {}
    asked = _asked(rules, tool, args, facts)
    if asked and history is not None:
        answers = history([q for _, q in asked])
        for (key, query), figures in zip(asked, answers, strict=True):
            facts[key] = (query, figures)
    return facts


def _asked(rules: list[dict[str, Any]], tool: str, args: Any, facts: Facts | None = None) -> list[tuple[int, history_mod.Query]]:
    """The queries of every history rule whose tool and condition match this call, by
    `_rule_key`; each such rule is entered in `facts` with no figures yet (None: a rule
    whose query cannot be asked stays so, and fails closed)."""
    asked: list[tuple[int, history_mod.Query]] = []
    for rule in rules:
        if "history" not in rule or rule["tool"] not in ("*", tool) or not _when_matches(rule, args):
            continue
        key = _rule_key(rule)
        if facts is not None:
            facts[key] = None
        try:
            asked.append((key, history_mod.query_for(rule, tool, args)))
        except (history_mod.Unevaluable, KeyError, TypeError, ValueError, AttributeError):
            continue
    return asked


def history_queries(policy: dict[str, Any] | None, tool: str, args: Any) -> list[history_mod.Query]:
    """What `verdict` will ask its `history` about this call under this policy, in the
    order it asks: a caller holding the figures beforehand (agents/actions/external.py
    reads them in an earlier round trip) answers from them."""
    return [q for _key, q in _asked(effective(policy)["rules"], tool, args)]


def _history_holds(rule: dict[str, Any], args: Any, facts: Facts) -> bool:
    fact = facts.get(_rule_key(rule))
    if fact is None:
        return bool(rule["then"] != "allow")  # no figures: fail closed
    try:
        return history_mod.holds(rule, args, fact[1])
    except (KeyError, TypeError, ValueError, AttributeError):
        return bool(rule["then"] != "allow")


def _why(rule: dict[str, Any], tool: str, args: Any, facts: Facts) -> tuple[str, dict[str, Any] | None]:
    """The deciding rule's reason, with its history figures in numbers when it has
    some: "a third refund of one order in a day: the 3rd refund call with order_id 1042
    in 24 h (over 2)"."""
    if "history" not in rule:
        return rule["reason"], None
    fact = facts.get(_rule_key(rule))
    if fact is None:
        return f"{rule['reason']} (its history could not be read, so the rule fails closed)", None
    try:
        reading = history_mod.reading(rule, tool, args, fact[0], fact[1]).to_dict()
    except (KeyError, TypeError, ValueError, AttributeError):
        return rule["reason"], None
    # One line of at most ONE_LINE_MAX as every reason (Slack and email cut there): the
    # rule's own words give way, never the figures.
    room = max(ONE_LINE_MAX - len(reading["text"]) - 2, 20)
    return f"{one_line(rule['reason'], room)}: {reading['text']}", reading


def _first(
    rules: list[dict[str, Any]], tool: str, args: Any, facts: Facts, *, shadow: bool = False
) -> dict[str, Any] | None:
    for rule in rules:
        if (rule.get("mode") == SHADOW) is not shadow:
            continue
        if rule["tool"] not in ("*", tool):
            continue
        if not _when_matches(rule, args):
            continue
        if "history" in rule and not _history_holds(rule, args, facts):
            continue
        return rule
    return None


def not_permitted(reason: str) -> dict[str, Any]:
    """The tool result a model sees for a denial or a rejection."""
    return {"ok": False, "error": "not_permitted", "detail": reason}
