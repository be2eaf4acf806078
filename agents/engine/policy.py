"""The action policy: allow, ask or deny a proposed call, with a reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .registry import ToolSpec

Action = Literal["allow", "ask", "deny"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    no_approver: bool = False  # an "ask" turned into "deny" because nobody may approve

    def to_dict(self) -> dict[str, str]:
        return {"action": self.action, "reason": self.reason}


def decide(
    spec: ToolSpec | None,
    tool: str,
    *,
    denied: list[str],
    always_ask: list[str],
    tainted: bool,
    approver: str,
) -> Verdict:
    """The design's order: profile deny, irreversible or always-ask, tainted write, allow.

    A tool missing from the registry counts as irreversible and external.
    """
    risk = spec.risk if spec else "irreversible"
    if tool in denied:
        return Verdict("deny", f"the agent profile denies the tool {tool}")
    verdict: Verdict | None = None
    if risk == "irreversible":
        verdict = Verdict("ask", f"{tool} is irreversible")
    elif tool in always_ask:
        verdict = Verdict("ask", f"the agent profile always asks before {tool}")
    elif risk == "write" and tainted:
        verdict = Verdict("ask", f"{tool} writes and the run has read external content")
    if verdict is None:
        return Verdict("allow", f"{tool} is {risk}" + (" (run tainted)" if tainted else ""))
    if approver == "none":
        return Verdict("deny", f"{verdict.reason}, and the run has no approver", no_approver=True)
    return verdict


def not_permitted(reason: str) -> dict[str, Any]:
    """The tool result a model sees for a denial or a rejection."""
    return {"ok": False, "error": "not_permitted", "detail": reason}
