"""Timeline entries as HTML: the timeline page's repeated fragment, built in Python.

A page shows 50 entries; through the template engine each cost about 170 µs (every
variable, filter and `{% if %}` is a node to resolve), which made the entries most of
the page's time. Here an entry is a few string joins, about 20 µs. Everything a model,
a tool or a reviewer produced (payloads, messages, notes, names) goes through `esc`
(agents/web/markup.py), which escapes it as the template's autoescape did: it stays inert
text. The page around the entries (header, chart, poller) stays in
agents/run_detail.html, whose `more` and `live` partials call `entries`.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from agents.engine.step import TRANSCRIPT_CAP
from agents.web.formatting import ms, number, pretty_json, usd
from agents.web.markup import esc, plural, url_for
from agents.web.timeline import PAGE_TEXT_MAX, Entry, cut_for_model, page_text

FOLD_OVER = 600  # characters: a longer result or argument list is folded into <details>


def _get(value: Any, key: str) -> Any:
    """`value.key` as the template looked it up: "" when it is not there."""
    return value.get(key, "") if isinstance(value, dict) else ""


def _time(value: datetime, tz: tzinfo) -> str:
    """A <time> with its ISO datetime, showing hours, minutes and seconds in `tz`."""
    local = value.astimezone(tz)
    return f'<time datetime="{local.isoformat()}">{local:%H:%M:%S}</time>'


def _folded(text: str, summary: str) -> str:
    """Long text folded behind its size and a preview; `summary` is escaped HTML."""
    preview = esc(Truncator(text).chars(120))
    return (
        f'<details><summary>{summary}: <span class="preview">{preview}</span></summary><pre>{esc(text)}</pre></details>'
    )


def _text(text: str, url: str) -> str:
    """A `<pre>` of text cut at PAGE_TEXT_MAX characters, with a link to the whole."""
    shown, cut = page_text(text)
    if not cut:
        return f"<pre>{esc(text)}</pre>"
    return (
        f'<pre>{esc(shown)}</pre><p class="cut muted">Cut at {number(PAGE_TEXT_MAX)} of {number(len(text))} '
        f'characters: <a href="{esc(url)}">the whole text</a>.</p>'
    )


def _message_url(m: Any) -> str:
    return reverse("run_message_text", args=[m.run_id, m.index])


def _message(m: Any) -> str:
    if m.role == "tool":
        content = m.content
        cut = cut_for_model(content)
        if len(content or "") > FOLD_OVER or cut:
            summary = f"{number(len(content or ''))} characters"
            if cut:
                summary += f" — <strong>cut at the {number(TRANSCRIPT_CAP)}-character transcript cap</strong>"
            body = _folded(content, summary)
        else:
            body = f"<pre>{esc(content)}</pre>"
        return (
            '<div class="msg msg-tool">\n'
            f'<span class="role">result of <code>{esc(m.name)}</code> '
            f'<span class="muted">{esc(m.tool_call_id)}</span></span>\n'
            f"{body}\n</div>"
        )
    if m.role == "assistant":
        parts = ['<div class="msg msg-assistant">\n<span class="role">model</span>']
        if m.content:
            parts.append(_text(m.content, _message_url(m)))
        calls = []
        for c in m.tool_calls or ():
            args = pretty_json(_get(c, "args"))
            shown = (
                _folded(args, f"arguments, {number(len(args))} characters")
                if len(args) > FOLD_OVER
                else f"<pre>{esc(args)}</pre>"
            )
            if len(args) > PAGE_TEXT_MAX:
                # The whole call is in the run's export (the same access as this page).
                shown = _folded(page_text(args)[0], f"arguments, {number(len(args))} characters") + (
                    f'<p class="cut muted">Cut at {number(PAGE_TEXT_MAX)} characters: the whole call is in '
                    f'<a href="{esc(reverse("run_export", args=[m.run_id]))}">the export</a>.</p>'
                )
            calls.append(
                f'<div class="call"><span class="call-name">calls <code>{esc(_get(c, "tool"))}</code> '
                f'<span class="muted">{esc(_get(c, "id"))}</span></span>{shown}</div>'
            )
        parts.append("".join(calls))
        return "\n".join(parts) + "\n</div>"
    role = "task" if m.role == "user" else esc(m.role)
    return f'<div class="msg msg-{esc(m.role)}"><span class="role">{role}</span>{_text(m.content, _message_url(m))}</div>'


def _decision(e: Entry, decision: dict[str, Any], tz: tzinfo) -> str:
    line = (
        f'<p class="decision">Reviewer decision <strong>{esc(decision["decision"])}</strong> on '
        f'<code>{esc(decision["tool"])}</code> by <strong class="who">{esc(decision["by"] or "unknown")}</strong>'
    )
    if e.approval is not None and e.approval.decided_at:
        line += f" at {_time(e.approval.decided_at, tz)}"
    if decision["note"]:
        line += f": “{esc(decision['note'])}”"
    if decision.get("via"):
        line += f' <span class="via">(via {esc(decision["via"])})</span>'
    line += "</p>"
    grant = e.grant
    if grant:
        which = "this exact" if "fp" in grant else "any"
        line += (
            f'\n    <p class="grant-line">Grant {esc(_get(grant, "n"))}: '
            f"{which} <code>{esc(_get(grant, 'tool'))}</code> "
            "call is allowed for the rest of the run.</p>"
        )
    return line


def _edit(edit: dict[str, Any]) -> str:
    note = f": “{esc(edit['note'])}”" if edit.get("note") else ""
    marks = {"del": "- ", "add": "+ "}
    lines = "".join(
        f'<span class="diff-{esc(kind)}">{marks.get(kind, "  ")}{esc(line)}</span>\n' for kind, line in edit["diff"]
    )
    return (
        '<div class="edit-diff"><p>Arguments edited by '
        f'<strong class="who">{esc(edit.get("by") or "a reviewer")}</strong>{note}. '
        "The call ran with the reviewer's arguments under its own idempotency key, and the agent was told.</p>"
        f'<pre class="diff" aria-label="Change to the arguments">{lines}</pre></div>'
    )


def _votes(votes: Any) -> str:
    shown = []
    for v in votes:
        note = f" (“{esc(_get(v, 'note'))}”)" if _get(v, "note") else ""
        shown.append(f'<strong class="who">{esc(_get(v, "by"))}</strong> {esc(_get(v, "decision"))}{note}')
    return f'<p class="votes">Votes: {", ".join(shown)}</p>'


def _uncounted(e: Entry) -> str:
    """Votes that decided nothing, kept in view: on an expiry, the round's votes that
    were too few; on a decision or an expiry, votes cast on arguments edited since."""
    a = e.approval
    if a is None:
        return ""
    record = a.vote_record()
    lines = []
    earlier = [r.vote for r in record if not r.counts]
    if earlier:
        lines.append(
            '<p class="votes votes-earlier">Votes on arguments edited afterwards (they did not count for the call '
            f"as edited): {_named(earlier)}</p>"
        )
    if e.t.kind == "expiry":
        current = [r.vote for r in record if r.counts]
        if current:
            lines.append(
                f'<p class="votes votes-expired">Votes cast before it expired ({a.required} needed): {_named(current)}</p>'
            )
    return "\n".join(lines)


def _named(votes: list[Any]) -> str:
    return ", ".join(
        f'<strong class="who">{esc(v.by_name)}</strong> {esc(v.decision)}' + (f" (“{esc(v.note)}”)" if v.note else "")
        for v in votes
    )


def _compaction(c: dict[str, Any]) -> str:
    folded = ", ".join(f"<code>{esc(i)}</code>" for i in c.get("folded") or ())
    return (
        f'<p class="flag flag-muted">Context compacted: {esc(c["count"])} older tool result{plural(c["count"])} '
        f"folded into stubs in the prompt (about {esc(number(c.get('tokens_before')))} → "
        f"{esc(number(c.get('tokens_after')))} tokens, budget {esc(number(c.get('budget')))}); "
        f"the transcript below keeps them whole. Folded: {folded}</p>"
    )


def _journal(j: Any) -> str:
    kept = " (the journal kept the first part)" if j.result_truncated else ""
    attempts = f"; {j.attempts} attempts" if j.attempts > 1 else ""
    return (
        f'<p class="journal muted">Journal: <code>{esc(j.tool)}</code> {esc(j.status)}; the full result is '
        f"{number(j.result_chars)} characters of JSON{kept}{attempts}.</p>"
    )


def _approval_link(pk: int) -> str:
    # The approval's own page, in any status: the queue shows only the first cards.
    return f'<a class="approval-link" href="{url_for("reviews:approval", pk)}">Approval #{pk}</a>'


def _approval(e: Entry, tz: tzinfo) -> str:
    a = e.approval
    assert a is not None
    if a.status == "denied":
        return (
            f'<p class="approval-line">{_approval_link(a.pk)}: <span class="status status-denied">denied</span> '
            "— the run has no approver.</p>"
        )
    if e.t.to_state != "awaiting_approval":
        return ""
    line = f'<p class="approval-line">{_approval_link(a.pk)} requested'
    if a.kind == "outcome_unknown":
        line += " (outcome unknown)"
    if a.required > 1:
        line += f", needing {a.required} votes"
    if a.expires_at:
        line += f", expiring at {_time(a.expires_at, tz)}"
    line += "; the answer is recorded as its own step."
    if a.status == "pending":
        votes = a.current_votes()
        if votes:
            line += " Votes so far:" + ",".join(
                f' <strong class="who">{esc(v.by_name)}</strong> {esc(v.decision)}' for v in votes
            )
        if a.edited_args is not None:
            who = a.edited_by.get_username() if a.edited_by is not None else ""
            line += f" Edited by {esc(who or 'a reviewer')} to <code>{esc(pretty_json(a.edited_args))}</code>."
    return line + "</p>"


def _body(e: Entry, tz: tzinfo) -> list[str]:
    """The entry's notes, each a line of the step body, in the order the page shows them."""
    t, payload = e.t, e.payload
    call = e.call
    out = []
    if e.tainted:
        out.append(
            f'<p class="flag flag-taint">⚑ This step tainted the run: <code>{esc(_get(call, "tool"))}</code> '
            "returned external content.</p>"
        )
    verdict = e.verdict
    if verdict:
        action = esc(_get(verdict, "action"))
        named = f" <code>{esc(_get(call, 'tool'))}</code>" if call else ""
        rule = f'<span class="rule">{esc(e.rule_label)}</span>: ' if e.rule_label else ""
        out.append(
            f'<p class="verdict verdict-{action}">Policy <strong>{action}</strong>{named}: '
            f"{rule}{esc(_get(verdict, 'reason'))}</p>"
        )
    invalid = e.invalid
    if invalid:
        out.append(f'<p class="flag flag-error">{esc(_get(invalid, "error"))}: {esc(_get(invalid, "detail"))}</p>')
    decision = e.decision
    if decision:
        out.append(_decision(e, decision, tz))
    grant = e.grant
    if t.kind == "revoke" and grant:
        out.append(
            f'<p class="grant-line">Grant {esc(_get(grant, "n"))} (<code>{esc(_get(grant, "tool"))}</code>) revoked by '
            f'<strong class="who">{esc(payload.get("by") or "unknown")}</strong>: its calls ask again.</p>'
        )
    edit = e.edit
    if edit:
        out.append(_edit(edit))
    if decision and decision["votes"]:
        out.append(_votes(decision["votes"]))
    expiry = e.expiry
    if expiry:
        then = "the run's policy fails the run" if expiry["on_expiry"] == "fail" else "the agent was told and goes on"
        out.append(f'<p class="flag flag-expired">Approval expired: {esc(expiry["reason"])}; {then}.</p>')
    if decision or expiry:
        uncounted = _uncounted(e)
        if uncounted:
            out.append(uncounted)
    if e.reason and not expiry:
        muted = "flag-muted" if t.to_state == "cancelled" else "flag-error"
        out.append(f'<p class="flag {muted}">{esc(e.reason)}</p>')
    tool_error = e.tool_error
    if tool_error:
        out.append(f'<p class="flag flag-error">Tool error: {esc(tool_error)}</p>')
    compaction = e.compaction
    if compaction:
        out.append(_compaction(compaction))
    out.extend(_message(m) for m in e.messages)
    if e.journal is not None:
        out.append(_journal(e.journal))
    if e.approval is not None:
        out.append(_approval(e, tz))
    return out


def entries(items: list[Entry]) -> SafeString:
    """The entries of a page, a live answer or a "load more", in order."""
    # The current time zone once for all, as the `date` filter shows times in it.
    tz = timezone.get_current_timezone()
    return mark_safe("".join(_entry(e, tz) for e in items))


def _entry(e: Entry, tz: tzinfo) -> str:
    t = e.t
    kind, seq = esc(t.kind), t.seq
    classes = f"step kind-{kind}{' is-tainted' if e.tainted else ''}{' is-failed' if t.to_state == 'failed' else ''}"
    moves = f'<span class="state state-{esc(t.from_state)}">{esc(t.from_state)}</span> →' if t.from_state else ""
    usage = e.usage
    tokens = number(t.tokens) + " tok"
    if _get(usage, "cached_input_tokens"):
        tokens += f", {number(usage['cached_input_tokens'])} cached"
    if _get(usage, "cache_write_tokens"):
        tokens += f", {number(usage['cache_write_tokens'])} cache writes"
    unknown = ' <span class="hint">cost unknown</span>' if e.cost_unknown else ""
    body = "\n    ".join(_body(e, tz))
    return (
        f'\n<li class="{classes}" id="t{seq}" data-seq="{seq}">\n'
        '  <div class="step-head">\n'
        f'    <span class="seq">#{seq}</span>\n'
        f'    <span class="moves">{moves} <span class="state state-{esc(t.to_state)}">{esc(t.to_state)}</span></span>\n'
        f'    <span class="kind">{kind}</span>\n'
        '    <span class="meta">\n'
        f"      {_time(t.created_at, tz)}\n"
        f'      <span title="time spent in this step">{esc(ms(t.duration_ms))}</span>\n'
        f'      <span title="cost of this step">{esc(usd(t.cost_micros))}{unknown}</span>\n'
        f'      <span title="tokens in this step">{esc(tokens)}</span>\n'
        f'      <span class="cum" title="cost so far">Σ {esc(usd(e.cumulative_cost))}</span>\n'
        f'      <span class="actor">{esc(t.actor)}</span>\n'
        "    </span>\n"
        "  </div>\n"
        '  <div class="step-body">\n'
        f"    {body}\n"
        "  </div>\n"
        "</li>\n"
    )
