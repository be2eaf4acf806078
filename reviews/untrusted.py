"""Point a reviewer at the part of untrusted content most likely to be an injected
instruction.

This is a reading aid, not a filter: nothing is removed or blocked, and a miss here
changes no decision (policy already asked the human). Text is split into sentences and
each sentence that matches a known injection shape is flagged with the reasons. The
template renders every segment as escaped text; flagged ones inside `<mark>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Verbs that turn a sentence into an order to move data or money or change something.
_ACTION_VERBS = (
    r"e-?mail|mail|send|forward|transfer|wire|pay|refund|delete|remove|drop|erase|wipe|post|publish|upload|share"
    r"|reveal|leak|export|exfiltrate|run|execute|invoke|grant|give|add|change|reset|disable|approve|write|create"
    r"|update|click|visit|open|download|install|call|contact|message|text|notify|include|attach|copy|paste|insert"
    r"|set|store|save|print|output|reply|respond|tell|say"
)
_LEAD = r"(?:(?:please|now|then|immediately|also|and|so|first|next|finally|urgent(?:ly)?|important|note|ai|assistant|agent)[:,!]?\s+)*"

RULES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"\b(?:ignore|disregard|forget|override|bypass|skip)\b[^.!?\n]{0,40}?"
            r"\b(?:previous|prior|above|earlier|all|any|your|the|these|those|other|original)\b[^.!?\n]{0,30}?"
            r"\b(?:instructions?|rules|directions|guidelines|prompts?|messages?|context|policy|policies|constraints)\b",
            re.I,
        ),
        "tells the agent to ignore its instructions",
    ),
    (
        re.compile(
            r"\b(?:you are now|new instructions?|system prompt|system message|developer mode|jailbreak|act as"
            r"|pretend (?:to be|you are)|from now on|your new (?:task|goal|role))\b|\[/?INST\]|<\|im_start\|>|^\s*system\s*:",
            re.I | re.M,
        ),
        "tries to change the agent's role or instructions",
    ),
    (
        re.compile(r"\b(?:do not|don't|never|without)\s+(?:tell|telling|inform|informing|mention|mentioning|alert|alerting|notify|notifying|asking)\b", re.I),
        "asks for secrecy",
    ),
    (
        re.compile(r"^\W*" + _LEAD + r"(?:" + _ACTION_VERBS + r")\b", re.I),
        "an imperative instruction",
    ),
    (
        re.compile(
            r"\b(?:assistants?|agents?|AI|models?|bots?|LLMs?|you)\b[^.!?\n]{0,20}?"
            r"\b(?:must|should|shall|need to|needs to|are required to|is required to|have to|will now)\s+(?:" + _ACTION_VERBS + r")\b",
            re.I,
        ),
        "addresses the agent with an order",
    ),
    (
        re.compile(
            r"\b(?:" + _ACTION_VERBS + r")\b[^.!?\n]{0,80}?\b(?:to|into|at|with)\b[^.!?\n]{0,60}?"
            r"(?:@|\bhttps?://|\baccounts?\b|\bcustomers?\b|\beveryone\b|\ball users\b|\bIBAN\b|\bwallet\b|\bpassword|\bcredentials?\b|\bapi key)",
            re.I,
        ),
        "asks to send data or money somewhere",
    ),
]

# A sentence ends at . ! ? followed by space, or at a line break; separators are kept
# so the segments join back to the exact text.
_SPLIT = re.compile(r"((?<=[.!?])\s+|\n+)")

SHOW_ALL_UP_TO = 6_000  # characters; longer content is shown around what was flagged
LEAD_CHARS = 1_500  # unflagged characters kept from the start of long content
FLAGGED_MAX = 1_500  # one flagged sentence is cut after this many characters


@dataclass
class Segment:
    text: str
    why: str = ""  # empty: not flagged
    omitted: int = 0  # > 0: a placeholder for this many characters not shown

    @property
    def flagged(self) -> bool:
        return bool(self.why)


@dataclass
class Untrusted:
    tool: str
    step: int | None
    origin: str = ""  # the URL the content came from, when the tool said
    segments: list[Segment] = field(default_factory=list)
    flagged: int = 0
    chars: int = 0
    missing: bool = False


def reasons(sentence: str) -> list[str]:
    return [why for pattern, why in RULES if pattern.search(sentence)]


def segments(text: str) -> list[Segment]:
    """The text as sentences and separators, each sentence flagged or not."""
    out: list[Segment] = []
    for i, piece in enumerate(_SPLIT.split(text)):
        if not piece:
            continue
        found = reasons(piece) if i % 2 == 0 else []
        out.append(Segment(piece, "; ".join(found)))
    return out


def shorten(parts: list[Segment]) -> list[Segment]:
    """Long content: keep its start and every flagged sentence, fold the rest."""
    if sum(len(p.text) for p in parts) <= SHOW_ALL_UP_TO:
        return parts
    kept: list[Segment] = []
    lead = 0
    skipped = 0
    for part in parts:
        keep = part.flagged or lead + len(part.text) <= LEAD_CHARS
        if not part.flagged and keep:
            lead += len(part.text)
        if not keep:
            skipped += len(part.text)
            continue
        if skipped:
            kept.append(Segment("", omitted=skipped))
            skipped = 0
        if part.flagged and len(part.text) > FLAGGED_MAX:
            kept.append(Segment(part.text[:FLAGGED_MAX], part.why))
            kept.append(Segment("", omitted=len(part.text) - FLAGGED_MAX))
        else:
            kept.append(part)
    if skipped:
        kept.append(Segment("", omitted=skipped))
    return kept


# A fetched page usually comes back as {"url": ..., "status": ..., "text": ...}: the
# reviewer reads the text as text, not as one long escaped JSON string.
_TEXT_FIELDS = ("text", "body", "content", "html", "markdown")


def result_text(result: Any) -> tuple[str, str]:
    """What the tool returned, as readable text, and where it came from (a URL, if said)."""
    if isinstance(result, dict):
        if result.get("truncated") and isinstance(result.get("result_json_prefix"), str):
            return str(result["result_json_prefix"]), ""
        if result.get("ok") is True and "result" in result:
            value = result["result"]
            if isinstance(value, str):
                return value, ""
            if isinstance(value, dict):
                for key in _TEXT_FIELDS:
                    if isinstance(value.get(key), str):
                        return value[key], str(value.get("url") or "")
            return json.dumps(value, indent=2, ensure_ascii=False, default=str), ""
    return json.dumps(result, indent=2, ensure_ascii=False, default=str), ""


def untrusted(tool: str, step: int | None, result: Any) -> Untrusted:
    text, origin = result_text(result)
    parts = segments(text)
    return Untrusted(
        tool=tool,
        step=step,
        origin=origin,
        segments=shorten(parts),
        flagged=sum(1 for p in parts if p.flagged),
        chars=len(text),
    )
