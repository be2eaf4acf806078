"""What the timeline page shows, read in a fixed number of queries per page.

A page is a window of transitions (by `seq`); the messages, journal rows and approvals
that belong to it are fetched with one query each, so a run of 10,000 steps costs the
same number of queries per page as a run of 3.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from django.db.models import prefetch_related_objects

from agents.engine import decisions
from agents.engine.policy import rule_label
from agents.engine.transcript import TRANSCRIPT_CAP
from agents.lib.rows import Rows, fetch, placeholders
from agents.models import Approval, Message, Run, ToolCall, Transition
from agents.runs import verify
from agents.web.formatting import pretty_json, usd

PAGE = 50  # transitions per page; "Load more" fetches the next ones by seq
TRUNCATION_MARK = "\n[airlock: result truncated, "
CHART_W, CHART_H, CHART_PAD = 640, 160, 28
CHART_POINTS = 400


# What an entry shows of its transition and of the messages it appended, read as rows
# (named tuples with these attributes) rather than model instances: building 50
# transitions and their messages as models was a fifth of reading them.
TRANSITION_FIELDS = (
    "seq", "from_state", "to_state", "kind", "payload", "cost_micros", "tokens", "duration_ms", "actor", "created_at",
)
# `run_id` and `index` name a message's whole text (run_message_text) when a page cuts it.
MESSAGE_FIELDS = ("seq", "role", "content", "tool_calls", "tool_call_id", "name", "run_id", "index")
# Characters of a task, an answer or a message a page shows; the rest is a link away. A
# 2.4 MB answer made a 4.8 MB timeline (issue 34, item 11); pages stay under 200 kB.
PAGE_TEXT_MAX = 10_000
# An entry shows the journal row's status and sizes, not the call or its result.
JOURNAL_FIELDS = ("call_id", "tool", "status", "result_chars", "result_truncated", "attempts")
_TRANSITIONS = Rows(Transition, TRANSITION_FIELDS)
_MESSAGES = Rows(Message, MESSAGE_FIELDS)
_JOURNAL = Rows(ToolCall, JOURNAL_FIELDS)
_APPROVALS_SQL = f"SELECT * FROM {Approval._meta.db_table} WHERE run_id = %s ORDER BY created_at, id"


def page_text(text: str | None) -> tuple[str, bool]:
    """`text` as a page shows it: at most PAGE_TEXT_MAX characters, and whether it was cut."""
    text = text or ""
    return (text, False) if len(text) <= PAGE_TEXT_MAX else (text[:PAGE_TEXT_MAX], True)


@dataclass
class Entry:
    t: Any  # the transition's TRANSITION_FIELDS
    cumulative_cost: int
    cumulative_tokens: int
    messages: list[Any] = field(default_factory=list)  # their MESSAGE_FIELDS, in order
    journal: Any = None  # the journal row's JOURNAL_FIELDS
    approval: Approval | None = None

    @property
    def payload(self) -> dict[str, Any]:
        return self.t.payload or {}

    @property
    def verdict(self) -> dict[str, Any] | None:
        return self.payload.get("verdict")

    @property
    def rule_label(self) -> str:
        """'rule 2 of the profile' when a rule decided this step's verdict."""
        verdict = self.verdict or {}
        rule = verdict.get("rule")
        # A grant's verdict names the rule it overrode in its own reason.
        return rule_label(rule) if isinstance(rule, dict) and "grant" not in verdict else ""

    @property
    def grant(self) -> dict[str, Any] | None:
        """The grant a decision made or a revocation ended."""
        grant = self.payload.get("grant") if self.t.kind in ("decision", "revoke") else None
        return grant if isinstance(grant, dict) else None

    @property
    def call(self) -> dict[str, Any] | None:
        return self.payload.get("call")

    @property
    def call_id(self) -> str | None:
        # A decision names its call by `call_id`; the other kinds carry `call`.
        call = self.payload.get("call")
        return call.get("id") if isinstance(call, dict) else self.payload.get("call_id")

    @property
    def tainted(self) -> bool:
        return bool(self.payload.get("tainted"))

    @property
    def reason(self) -> str | None:
        return self.payload.get("reason")

    @property
    def decision(self) -> dict[str, Any] | None:
        if self.t.kind != "decision":
            return None
        shown = {k: self.payload.get(k) for k in ("decision", "by", "note", "tool", "votes")}
        # Where the deciding answer came from: the last vote's channel (older runs: none).
        votes = shown["votes"] if isinstance(shown["votes"], list) else []
        last = votes[-1] if votes and isinstance(votes[-1], dict) else {}
        shown["via"] = last.get("via") or ""
        return shown

    @property
    def edit(self) -> dict[str, Any] | None:
        """A reviewer's edit of the call's arguments, with the change as diff lines."""
        edit = self.payload.get("edit")
        if self.t.kind != "decision" or not isinstance(edit, dict):
            return None
        return {**edit, "diff": args_diff(edit.get("from"), edit.get("to"))}

    @property
    def expiry(self) -> dict[str, Any] | None:
        if self.t.kind != "expiry":
            return None
        return {"reason": self.payload.get("reason"), "on_expiry": self.payload.get("on_expiry")}

    @property
    def tool_error(self) -> str | None:
        if self.t.kind == "tool" and not self.payload.get("ok", True):
            return str(self.payload.get("error") or "error")
        return None

    @property
    def invalid(self) -> dict[str, Any] | None:
        return self.payload.get("invalid")

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.payload.get("usage")

    @property
    def compaction(self) -> dict[str, Any] | None:
        """What a `compact` step folded out of the prompt (the transcript keeps it all)."""
        if self.t.kind != "compact":
            return None
        return {**self.payload, "count": len(self.payload.get("folded") or [])}

    @property
    def fork(self) -> dict[str, Any] | None:
        """A fork's first entry: where its copied history came from (agents/actions/forks.py)."""
        fork = self.payload.get("fork") if self.t.kind == "fork" else None
        return fork if isinstance(fork, dict) else None

    @property
    def reused(self) -> dict[str, Any] | None:
        """A fork's tool step that took its parent's recorded result instead of running."""
        reused = self.payload.get("reused") if self.t.kind == "tool" else None
        return reused if isinstance(reused, dict) else None

    @property
    def prior(self) -> dict[str, Any] | None:
        """A fork's proposed call that its parent already made after the fork point."""
        prior = self.payload.get("prior")
        return prior if isinstance(prior, dict) else None

    @property
    def cost_unknown(self) -> bool:
        return self.t.kind == "model" and "usage" in self.payload and self.payload["usage"] is None


def cut_for_model(content: str | None) -> bool:
    """True when the engine cut this tool result at the transcript cap."""
    return TRUNCATION_MARK in (content or "")


def args_diff(before: Any, after: Any) -> list[tuple[str, str]]:
    """(kind, line) pairs of a line diff of two argument objects as pretty JSON; kind is
    `del`, `add` or `same`."""

    out = []
    for line in difflib.ndiff(pretty_json(before).splitlines(), pretty_json(after).splitlines()):
        tag, text = line[:1], line[2:]
        if tag == "?":
            continue
        out.append(({"-": "del", "+": "add"}.get(tag, "same"), text))
    return out


def series(run: Run) -> list[tuple[int, int, int]]:
    """(seq, cost, tokens) of every transition: three integers a row, for the chart."""
    return series_and_cache(run)[0]


# The usage figures come as text on PostgreSQL (numbers on SQLite), summed in Python:
# a numeric expression would make the database convert two values on every one of the
# run's rows. `->` and `->>` read the same on both.
_SERIES_SQL = (
    "SELECT seq, cost_micros, tokens, "
    + ", ".join(
        f"CASE WHEN kind = 'model' THEN payload -> 'usage' ->> '{key}' END" for key in Transition.CACHE_USAGE.values()
    )
    + f" FROM {Transition._meta.db_table} WHERE run_id = %s ORDER BY seq"
)


def series_and_cache(run: Run) -> tuple[list[tuple[int, int, int]], dict[str, int]]:
    """series(), and Run.cache_tokens() summed from the same rows: the page's chart and
    its header in one query (the two were a millisecond apart, most of it ORM work).
    Plain SQL: as a queryset, building and converting it cost more than running it."""
    points, read, write = [], 0, 0
    for seq, cost, tokens, r, w in fetch(_SERIES_SQL, [run.pk]):
        points.append((seq, cost, tokens))
        if r:
            read += int(r)
        if w:
            write += int(w)
    return points, {"read": read, "write": write}


def run_approvals(run: Run) -> list[Approval]:
    """Every approval of the run, oldest first: the header lists them, the entries name them."""
    # As a raw query: most runs have none, and building the queryset took twice as long
    # as the statement (0.4 ms against 0.2 ms); the rows are still models.
    approvals = list(Approval.objects.raw(_APPROVALS_SQL, [run.pk]))
    Approval.prefetch_people(approvals)
    # Every vote, counted or not: the header and the entries keep them on the record.
    prefetch_related_objects(approvals, "votes")
    return approvals


def page(
    run: Run,
    *,
    after: int = 0,
    limit: int = PAGE,
    points: list[tuple[int, int, int]] | None = None,
    approvals: list[Approval] | None = None,
) -> tuple[list[Entry], bool]:
    """Transitions with seq > `after`, at most `limit`, and whether more follow.

    `points` (series()) and `approvals` (run_approvals()) when the caller has them."""
    rows = _TRANSITIONS.fetch("run_id = %s AND seq > %s", [run.pk, after], order_by="seq", limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    if not rows:
        return [], False
    first, last = rows[0].seq, rows[-1].seq
    points = points if points is not None else series(run)
    cum_cost = cum_tokens = 0
    cumulative: dict[int, tuple[int, int]] = {}
    for seq, cost, tokens in points:
        cum_cost += cost
        cum_tokens += tokens
        if first <= seq <= last:
            cumulative[seq] = (cum_cost, cum_tokens)
    messages: dict[int, list[Any]] = {}
    appended = _MESSAGES.fetch("run_id = %s AND seq >= %s AND seq <= %s", [run.pk, first, last], order_by='"index"')
    for m in appended:
        messages.setdefault(m.seq, []).append(m)
    entries = [Entry(r, *cumulative.get(r.seq, (0, 0)), messages.get(r.seq, [])) for r in rows]
    call_ids = {e.call_id for e in entries if e.call_id}
    ids = sorted(call_ids)
    in_ids = f"run_id = %s AND call_id IN ({placeholders(ids)})"
    journal = {j.call_id: j for j in _JOURNAL.fetch(in_ids, [run.pk, *ids], order_by="id")} if ids else {}
    if approvals is None:
        approvals = run_approvals(run) if call_ids else []
    # One call can have two approvals (policy, then "outcome unknown" after a crash).
    by_call = {(a.call_id, a.kind): a for a in approvals if a.call_id in call_ids}
    # The votes the entries list (already read when the caller's run_approvals() did).
    prefetch_related_objects(list(by_call.values()), "votes")
    for e in entries:
        if not e.call_id:
            continue
        if e.t.kind == "tool":
            e.journal = journal.get(e.call_id)
        if e.t.to_state == "awaiting_approval" or e.t.kind in ("decision", "expiry") or (e.verdict or {}).get("action") == "deny":
            kind = (
                decisions.OUTCOME_UNKNOWN
                if e.t.kind == "outcome_unknown"
                or e.payload.get("decision") in decisions.KIND_DECISIONS[decisions.OUTCOME_UNKNOWN]
                else decisions.POLICY
            )
            # A fork's "already ran" question takes approve and reject too.
            e.approval = by_call.get((e.call_id, kind)) or by_call.get((e.call_id, decisions.ALREADY_RAN))
    return entries, more


@dataclass
class Chart:
    width: int
    height: int
    cost_points: str
    token_points: str
    total_cost: int
    total_tokens: int
    steps: int
    y_labels: list[tuple[float, str]]
    x_labels: list[tuple[float, str]]
    plot_cost: bool

    @property
    def left(self) -> int:
        return CHART_PAD * 2

    @property
    def bottom(self) -> int:
        return self.height - CHART_PAD

    @property
    def right(self) -> int:
        return self.width - 8


def inherited(run: Run) -> tuple[int, int]:
    """The cost and tokens a fork took over from its parent (its first transition says
    so; `verify` starts its sums from the same figures); (0, 0) for a run of its own."""
    if run.forked_from_id is None:
        return 0, 0
    first = run.transitions.order_by("seq").only("payload").first()
    return verify.inherited(first.payload or {}) if first is not None else (0, 0)


def chart(points: list[tuple[int, int, int]], start: tuple[int, int] = (0, 0)) -> Chart | None:
    """A cumulative cost line (and tokens, scaled to the same height) over the transitions,
    from `start`: what a fork inherited, so its chart agrees with its header.

    Coordinates are computed here so the SVG needs no script and no style attribute
    (the CSP allows neither); large runs are sampled down to CHART_POINTS points.
    """
    if len(points) < 2:
        return None
    cum: list[tuple[int, int, int]] = []
    cost, tokens = start
    for seq, c, t in points:
        cost += c
        tokens += t
        cum.append((seq, cost, tokens))
    if len(cum) > CHART_POINTS:
        stride = len(cum) / CHART_POINTS
        cum = [cum[int(i * stride)] for i in range(CHART_POINTS)] + [cum[-1]]
    left, right, top, bottom = CHART_PAD * 2, CHART_W - 8, 10, CHART_H - CHART_PAD
    max_seq = max(cum[-1][0], 2)
    min_seq = cum[0][0]
    max_cost, max_tokens = max(cost, 1), max(tokens, 1)
    span, width, height = max(max_seq - min_seq, 1), right - left, bottom - top

    def x(seq: int) -> float:
        return round(left + (seq - min_seq) / span * width, 1)

    def y(value: int, top_value: int) -> float:
        return round(bottom - value / top_value * height, 1)

    plot_cost = cost > 0
    # x() and y() inlined over the points, each x once for both lines, and ":.1f" for
    # str(round(v, 1)) (the same digits in this range): 1,600 calls to round() were a
    # millisecond of the page.
    xs = [f"{left + (s - min_seq) / span * width:.1f}," for s, _, _ in cum]
    on_x = list(zip(xs, cum, strict=True))
    cost_line = " ".join([f"{px}{bottom - c / max_cost * height:.1f}" for px, (_, c, _) in on_x])
    token_line = " ".join([f"{px}{bottom - t / max_tokens * height:.1f}" for px, (_, _, t) in on_x])
    if plot_cost:
        y_labels = [(y(0, max_cost), "$0"), (y(max_cost // 2, max_cost), usd(max_cost // 2)), (float(top), usd(cost))]
    else:
        y_labels = [(y(0, max_tokens), "0"), (float(top), f"{tokens:,} tok")]
    x_labels = [(x(min_seq), f"#{min_seq}"), (x(max_seq), f"#{max_seq}")]
    return Chart(CHART_W, CHART_H, cost_line, token_line, cost, tokens, len(points), y_labels, x_labels, plot_cost)


__all__ = [
    "PAGE", "TRANSCRIPT_CAP", "Chart", "Entry", "chart", "cut_for_model", "inherited", "page", "run_approvals", "series",
    "series_and_cache",
]
