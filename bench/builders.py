"""The review cards, the timeline's entries and the runs list's rows as the string
builders printed them before the Jinja2 templates (reviews/card_html.py,
agents/web/timeline_html.py and agents/web/runs_html.py up to the templates), kept as
they were: the oracle of tests/reviews/test_card_oracle.py,
tests/pages/test_timeline_oracle.py and tests/pages/test_runs_rows_oracle.py, and the baseline of bench/fragments.py. Do not fix
or restyle them: they are the bytes the templates must print. Needs Django set up."""

from __future__ import annotations

import functools
import unicodedata
from datetime import datetime, tzinfo
from html import escape
from typing import Any

from django.template import Context, Template
from django.template.defaulttags import CsrfTokenNode
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from agents.engine.decisions import DECISIONS
from agents.engine.policy import shadow_label
from agents.engine.transcript import TRANSCRIPT_CAP
from agents.web.formatting import ms, number, pretty_json, since, usd
from agents.web.markup import url_for
from agents.web.timeline import PAGE_TEXT_MAX, Entry, cut_for_model, page_text
from reviews.cards import Card, ClaimLine, OnScreen, Quorum, ToolSource
from reviews.untrusted import Untrusted


def esc(value: Any) -> str:
    """agents.web.markup.esc as it was."""
    return escape(str(value))


def plural(count: Any, forms: str = ",s") -> str:
    one, many = forms.split(",")
    return one if count == 1 else many


# -- reviews/card_html.py ------------------------------------------------------------------

TASK_CHARS = 600  # a longer task is cut on the card; the run's timeline shows it whole
DESCRIPTION_CHARS = 300  # an MCP server's description of its tool, cut on the card


class _Shared:
    """What every card of one answer shares, worked out once rather than per card."""

    def __init__(self, context: Context, *, preserve: bool) -> None:
        self.context = context
        self.can_decide = bool(context.get("can_decide"))  # the viewer may answer
        self.preserve = preserve  # hx-preserve: in the list, not in a decision's answer
        self.tz = timezone.get_current_timezone()  # as the `date` filter shows times

    @functools.cached_property
    def hidden(self) -> str:
        """The queue's filters as hidden inputs: a decision keeps them."""
        filters = self.context.get("filters")
        # On the approval's own page the decision comes back to that page, not the queue.
        back = '<input type="hidden" name="back" value="approval">' if self.context.get("on_own_page") else ""
        return back + "".join(
            f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'
            for name, value in (filters.query().items() if filters else ())
        )

    @functools.cached_property
    def csrf(self) -> str:
        return CsrfTokenNode().render(self.context)

    def local(self, value: datetime) -> datetime:
        return value.astimezone(self.tz)

    def iso(self, value: datetime) -> str:
        return value.astimezone(self.tz).isoformat()


def _task(text: str) -> str:
    """The task as `truncatechars` cuts it (NFC-normalised, as Truncator returns it)."""
    text = unicodedata.normalize("NFC", text)
    return text if len(text) <= TASK_CHARS else Truncator(text).chars(TASK_CHARS)


def _urls(pk: int) -> dict[str, str]:
    return {d: url_for(f"reviews:{d}", pk) for d in DECISIONS}


def quorum(q: Quorum, *, oob: bool = False) -> SafeString:
    """A card's vote counter; out of band (`oob`) for a card the polling page keeps."""
    votes = ", ".join(f'<span class="voter">{esc(v.by_name)}</span> ({esc(v.decision)})' for v in q.votes)
    swap = ' hx-swap-oob="true"' if oob else ""
    return mark_safe(
        f'<p class="quorum" id="approval-{q.pk}-quorum"{swap}>'
        f'<strong class="count">{q.approvals} of {q.required} approvals</strong>'
        f"{': ' + votes if votes else ''}</p>"
    )


def claim_line(cl: ClaimLine, shared: _Shared, *, oob: bool = False) -> str:
    """Who is on a pending call, with Claim / Release; out of band (`oob`) for a card the
    polling page keeps whose claim changed."""
    classes = f"claim{' is-claimed' if cl.by else ''}{' is-mine' if cl.mine else ''}"
    swap = ' hx-swap-oob="true"' if oob else ""
    out = [
        f'<div class="{classes}" id="approval-{cl.pk}-claim"{swap}>\n'
        f'<input type="hidden" name="claim" value="{cl.pk}:{esc(cl.token)}">\n'
    ]
    if cl.by and cl.until is not None:
        local = shared.local(cl.until)
        who = "You claimed this" if cl.mine else f'Claimed by <strong class="who">{esc(cl.by)}</strong>'
        out.append(f'<p class="claimed">{who} until <time datetime="{local.isoformat()}">{local:%H:%M}</time></p>\n')
    if cl.may_claim or cl.may_release:
        take, release = url_for("reviews:claim", cl.pk), url_for("reviews:release", cl.pk)
        out.append(
            f'<form class="claim-form" method="post" action="{take}" hx-post="{take}" hx-target="closest .claim"'
            f' hx-swap="outerHTML">\n{shared.csrf}\n{shared.hidden}'
        )
        if cl.may_claim:
            label = "Extend claim" if cl.mine else "Claim"
            out.append(
                f'<button type="submit" class="claim-button" data-key="c" formaction="{take}" hx-post="{take}">'
                f"{label}</button>\n"
            )
        if cl.may_release:
            out.append(
                f'<button type="submit" class="release-button" formaction="{release}" hx-post="{release}">'
                "Release</button>\n"
            )
        out.append("</form>\n")
    if cl.message:
        out.append(f'<p class="claim-message" role="status">{esc(cl.message)}</p>\n')
    out.append("</div>")
    return "".join(out)


def _untrusted(t: Untrusted, pk: int) -> str:
    where = f" at step {esc(t.step)}" if t.step is not None else ""
    origin = f' from <code class="origin">{esc(t.origin)}</code>' if t.origin else ""
    flagged = ""
    if t.flagged:
        n = t.flagged
        flagged = (
            f'<strong class="flag-count">{n} passage{plural(n)} look{plural(n, "s,")} like '
            f"{plural(n, 'an instruction,instructions')} to the agent (highlighted).</strong>"
        )
    if t.missing:
        text = '<p class="muted">The tainting call\'s result is not in the journal.</p>'
    else:
        shown = []
        for s in t.segments:
            if s.omitted:
                shown.append(f'<span class="omitted">[… {s.omitted} characters not shown …]</span>')
            elif s.flagged:
                shown.append(f'<mark class="suspect" title="{esc(s.why)}">{esc(s.text)}</mark>')
            else:
                shown.append(esc(s.text))
        text = f'<pre class="untrusted-text" tabindex="0">{"".join(shown)}</pre>'
    return (
        f'<section class="untrusted" aria-label="Untrusted content, approval {pk}">\n'
        '<h3><span class="warn-icon" aria-hidden="true">!</span> Untrusted content that tainted this run</h3>\n'
        f'<p class="source">Returned by <code>{esc(t.tool)}</code>{where}{origin}. It came from outside and may '
        f"carry instructions aimed at the agent: treat it as data.\n{flagged}</p>\n{text}\n</section>"
    )


def _source(source: ToolSource, risk: str) -> str:
    """Where an MCP tool comes from; its description is the server's text, shown inert."""
    description = ""
    if source.description:
        text = Truncator(source.description).chars(DESCRIPTION_CHARS)
        description = f' The server describes it: <q class="tool-description">{esc(text)}</q>'
    override = ""
    if source.risk_override and source.risk_override == risk:
        override = (
            f' <strong class="risk-override">Risk {esc(risk)} was set by an operator\'s override</strong> (the '
            f"server's annotations say {esc(source.annotated_risk)})."
        )
    return (
        f'<p class="tool-source">From MCP server <code class="server">{esc(source.server)}</code>.'
        f"{description}{override}</p>\n"
    )


def _form(card: Card, shared: _Shared) -> str:
    """The answers a reviewer may give: approve, reject, edit, grant; or, for a call whose
    outcome is unknown, whether it happened."""
    a = card.approval
    pk = a.pk
    urls = _urls(pk)
    if card.outcome_unknown:
        happened, retry, fail = urls["happened"], urls["retry"], urls["fail"]
        fields = (
            '<label class="note"><span>What happened? <span class="muted">With “It happened” this becomes the tool\'s '
            'result.</span></span>\n<textarea name="note" rows="2" maxlength="4000"></textarea></label>\n'
            '<div class="buttons">\n'
            f'<button type="submit" class="primary" formaction="{happened}" hx-post="{happened}">It happened</button>\n'
            f'<button type="submit" formaction="{retry}" hx-post="{retry}">Run it again</button>\n'
            f'<button type="submit" class="danger" formaction="{fail}" hx-post="{fail}">Fail the run</button>\n'
            "</div>"
        )
    else:
        approve, reject = urls["approve"], urls["reject"]
        error = card.edit_error
        refused = f'<p class="decide-error" role="alert">{esc(error)}</p>' if error else ""
        grant = ""
        if card.can_grant:
            grant = (
                f'<button type="submit" class="grant" name="remember" value="tool" formaction="{approve}" '
                f'hx-post="{approve}" title="Approve this call, and let every later {esc(a.tool)} call of run '
                f"#{a.run_id} through without asking, until someone revokes it on the run's timeline\">"
                "Approve and allow for this run</button>"
            )
        fields = (
            '<label class="note"><span>Note to the agent <span class="muted">optional, sent with a rejection; kept on '
            "the record with an edit</span></span>\n"
            '<textarea name="note" rows="1" maxlength="4000"></textarea></label>\n'
            f'<div class="edit" id="approval-{pk}-edit"{"" if error else " hidden"}>\n'
            '<label><span>Arguments to run instead <span class="muted">JSON, checked against the schema and the policy '
            'again</span></span>\n<textarea name="args" rows="6" maxlength="100000" spellcheck="false"'
            f"{'' if error else ' disabled'}>{esc(card.edit_text if error else card.run_json)}</textarea></label>\n"
            f"{refused}\n"
            f'<button type="submit" class="approve" formaction="{approve}" hx-post="{approve}">'
            "Approve with these arguments</button>\n</div>\n"
            '<div class="buttons">\n'
            f'<button type="submit" class="approve" data-key="a" formaction="{approve}" hx-post="{approve}"'
            f"{' hidden' if error else ''}>Approve</button>\n"
            f'<button type="submit" class="reject" data-key="r" formaction="{reject}" hx-post="{reject}">'
            "Reject</button>\n"
            f"{grant}\n"
            f'<button type="button" class="edit-args" aria-expanded="{"true" if error else "false"}" '
            f'aria-controls="approval-{pk}-edit">{"Cancel edit" if error else "Edit arguments"}</button>\n'
            "</div>"
        )
    # The call this card shows, by hash: an answer counts only for that call (a stale
    # card is refused with 409 call_changed and comes back with the call as it stands).
    bound = f'<input type="hidden" name="args_hash" value="{esc(card.args_hash)}">'
    return (
        f'<form class="decide" method="post" action="{urls["approve"]}" hx-target="closest article" '
        'hx-swap="outerHTML" hx-sync="closest .queue-list:queue first" hx-disabled-elt="closest fieldset">\n'
        f"{shared.csrf}\n{shared.hidden}\n{bound}\n<fieldset>\n{fields}\n</fieldset>\n</form>"
    )


def _pending(card: Card, shared: _Shared) -> str:
    """What a pending card offers the viewer: the answers, or why they cannot give one."""
    a = card.approval
    # `seen`: the call this card shows, so the poll can tell when another reviewer edits it.
    shown = (
        f'<input type="hidden" name="shown" value="{a.pk}">'
        f'<input type="hidden" name="seen" value="{a.pk}:{esc(card.args_hash)}">'
    )
    if not shared.can_decide:
        return shown
    if card.separated:
        return (
            f'{shown}\n<p class="notice separated">You launched this run and its policy separates duties: another '
            "reviewer must decide.</p>"
        )
    if card.my_vote:
        missing = card.missing
        waiting = f"; waiting for {missing} more approval{plural(missing)} from other reviewers" if missing else ""
        return f'{shown}\n<p class="notice voted">You already voted ({esc(card.my_vote.decision)}){waiting}.</p>'
    return f"{shown}\n{_form(card, shared)}"


def _decided(card: Card, shared: _Shared) -> str:
    a = card.approval
    by = f' by <strong class="who">{esc(card.decided_by)}</strong>' if card.decided_by else ""
    at = ""
    if a.decided_at:
        local = shared.local(a.decided_at)
        at = f' at <time datetime="{local.isoformat()}">{local:%Y-%m-%d %H:%M:%S} UTC</time>'
    note = f'\n<p class="decision-note"><span class="label">Note</span>{esc(a.note)}</p>' if a.note else ""
    late = f'\n<p class="late" role="alert">{esc(card.message)}</p>' if card.late and card.message else ""
    return (
        f'<div class="decision decision-{esc(a.status)}" role="status">\n'
        f'<input type="hidden" name="keep" value="{a.pk}">\n'
        f'<p><strong class="verdict">{esc(card.decided_label)}</strong>{by}{at}</p>{note}{late}\n</div>'
    )


def old_card(card: Card, context: Context) -> SafeString:
    """The card of one approval; `context` gives the viewer's rights (`can_decide`), the
    queue's `filters` (kept through a decision), `preserve` and the CSRF token."""
    return mark_safe(_card(card, _Shared(context, preserve=bool(context.get("preserve")))))


def old_cards(items: list[Card | OnScreen], context: Context) -> SafeString:
    """The list's cards, each kept by the page when it is there (hx-preserve); a card
    the polling page already shows comes as an empty stand-in, with its vote counter
    out of band."""
    shared = _Shared(context, preserve=True)
    out = []
    for item in items:
        if isinstance(item, OnScreen):
            out.append(
                f'<article class="card" id="approval-{item.pk}" data-approval-id="{item.pk}" hx-preserve="true">'
                "</article>"
            )
            if item.quorum:
                out.append(quorum(item.quorum, oob=True))
            if item.claim:
                out.append(claim_line(item.claim, shared, oob=True))
        else:
            out.append(_card(item, shared))
    return mark_safe("".join(out))


def _card(card: Card, shared: _Shared) -> str:
    a = card.approval
    run = a.run
    pk = a.pk
    pending = card.pending
    unknown = card.outcome_unknown
    edited = a.edited_args is not None
    classes = f"card card-{esc(a.risk)}{'' if pending else ' is-decided'}{' kind-unknown' if unknown else ''}"
    expires = ""
    if pending and a.expires_at:
        until = int(a.expires_at.timestamp())
        expires = (
            f'<span class="expires{" expiring" if card.expiring else ""}" data-until="{until}" '
            f'data-total="{card.timeout_seconds}">expires in <time datetime="{shared.iso(a.expires_at)}">'
            f"{esc(card.time_left)}</time></span>"
        )
    elif pending:
        # #47: a call without an expiry of its own shows its run's deadline.
        deadline = a.run.deadline
        expires = (
            f'<span class="expires run-deadline{" expiring" if card.run_deadline_expiring else ""}" '
            f'data-until="{int(deadline.timestamp())}" data-total="{card.run_deadline_total}" '
            f"title=\"the run's deadline: the call expires with its run\">run deadline in "
            f'<time datetime="{shared.iso(deadline)}">{esc(card.run_deadline_left)}</time></span>'
        )
    rule = f'<span class="rule">{esc(a.rule_label)}</span>: ' if a.rule_label else ""
    needed = f' <span class="muted">({a.required} approvals needed)</span>' if a.required > 1 else ""
    if unknown:
        which = "(the interrupted call)"
    elif edited:
        which = "(as the agent proposed them)"
    elif pending:
        which = "(exactly what will run)"
    elif a.status == "approved":
        which = "(as approved)"
    else:
        which = "(as the agent proposed them; not run)"
    edit = ""
    if edited:
        edit = (
            f'<section class="edited">\n<h3>Edited by <strong class="who">{esc(card.edited_by)}</strong> '
            f'<span class="muted">({"what will run" if pending else "what ran"})</span></h3>\n'
            f'<pre class="json" tabindex="0">{esc(card.edited_json)}</pre>\n</section>'
        )
    q = card.quorum
    kind = '<span class="kind">outcome unknown</span>' if unknown else ""
    tainted = (
        '<span class="tainted" title="the run has read external content">tainted run</span>' if run.tainted else ""
    )
    overridden = card.source is not None and card.source.risk_override == a.risk
    risk_title = "risk set by an operator's override" if overridden else "risk declared by the tool"
    # A card whose call changed replaces the stale one on screen: not preserved.
    preserve = ' hx-preserve="true"' if shared.preserve and not card.changed else ""
    changed = f'\n<p class="call-changed" role="alert">{esc(card.changed)}</p>' if card.changed else ""
    claim = "\n" + claim_line(card.claim, shared) if card.claim else ""
    message = ""
    if pending and card.message and not card.edit_error and not card.changed:
        message = f'<p class="vote-recorded" role="status">{esc(card.message)}</p>'
    return (
        f'\n<article class="{classes}" id="approval-{pk}" data-approval-id="{pk}" data-status="{esc(a.status)}"'
        f'{preserve} tabindex="-1" aria-labelledby="approval-{pk}-title">\n'
        '<header class="card-head">\n'
        f'<h2 id="approval-{pk}-title"><code class="tool">{esc(a.tool)}</code></h2>\n'
        f'<span class="risk risk-{esc(a.risk)}" title="{risk_title}">{esc(a.risk)}</span>\n'
        f"{kind}\n"
        f"{tainted}\n"
        '<span class="spacer"></span>\n'
        f'<span class="waited">{"waiting" if pending else "waited"} <time datetime="{shared.iso(a.created_at)}" '
        f'data-since="{int(a.created_at.timestamp())}">{esc(card.waited)}</time></span>\n'
        f"{expires}\n"
        f"</header>{claim}{changed}\n"
        f"{_source(card.source, a.risk) if card.source else ''}"
        '<dl class="facts">\n'
        f'<div class="reason"><dt>Why asked</dt><dd>{rule}{esc(a.reason)}{needed}</dd></div>\n'
        f'<div><dt>Run</dt><dd><a href="/runs/{run.pk}/">#{run.pk} timeline</a> <span class="muted">· agent '
        f"{esc(a.agent_name)} · step {a.step}</span></dd></div>\n"
        f'<div class="task"><dt>Task</dt><dd>{esc(_task(run.task))}</dd></div>\n'
        "</dl>\n"
        '<section class="args">\n'
        f'<h3>Arguments <span class="muted">{which}</span></h3>\n'
        f'<pre class="json" tabindex="0">{esc(card.args_json)}</pre>\n'
        "</section>\n"
        f"{edit}\n"
        f"{quorum(q) if q else ''}\n"
        f"{_untrusted(card.taint, pk) if card.taint else ''}\n"
        f"{_pending(card, shared) if pending else _decided(card, shared)}\n"
        f"{message}\n"
        "</article>\n"
    )


# -- agents/web/timeline_html.py ----------------------------------------------------------

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
    return (
        f'<div class="msg msg-{esc(m.role)}"><span class="role">{role}</span>{_text(m.content, _message_url(m))}</div>'
    )


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
        for entry in payload.get("shadow") or ():
            out.append(f'<p class="verdict-shadow">{esc(shadow_label(entry))} (it decides nothing)</p>')
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


def old_entries(items: list[Entry]) -> SafeString:
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


# -- agents/web/runs_html.py ---------------------------------------------------------------

# The runs list's rows as the Django template loop printed them (before the string builder).
DJANGO_ROWS = Template(
    """{% load airlock %}{% for run in rows %}
    <tr>
      <td><a href="{% url 'run_detail' run.pk %}">#{{ run.pk }}</a><div class="task-line">{{ run.task|truncatechars:90 }}</div></td>
      <td>{{ run.profile.name }}</td>
      <td><span class="state state-{{ run.state }}">{{ run.state }}</span></td>
      <td class="num">{{ run.steps }}</td>
      <td class="num">{{ run.cost_micros|usd }}{% if run.cost_unknown %} <span class="hint" title="a model call reported no usage">+?</span>{% endif %}</td>
      <td class="num">{{ run.tokens|number }}</td>
      <td>{% if run.tainted %}<span class="taint-badge">tainted</span>{% endif %}</td>
      <td><time datetime="{{ run.created_at|date:'c' }}">{{ run.created_at|date:"Y-m-d H:i" }}</time></td>
      <td class="num">{{ run.created_at|since:run.finished_at }}</td>
    </tr>{% endfor %}"""  # noqa: E501
)


def old_row(run: Any, tz: Any) -> str:
    created = run.created_at.astimezone(tz)
    unknown = ' <span class="hint" title="a model call reported no usage">+?</span>' if run.cost_unknown else ""
    taint = '<span class="taint-badge">tainted</span>' if run.tainted else ""
    return (
        "    <tr>\n"
        f'      <td><a href="{reverse("run_detail", args=[run.pk])}">#{run.pk}</a>'
        f'<div class="task-line">{esc(Truncator(run.task).chars(90))}</div></td>\n'
        f"      <td>{esc(run.profile.name)}</td>\n"
        f'      <td><span class="state state-{esc(run.state)}">{esc(run.state)}</span></td>\n'
        f'      <td class="num">{run.steps}</td>\n'
        f'      <td class="num">{usd(run.cost_micros)}{unknown}</td>\n'
        f'      <td class="num">{number(run.tokens)}</td>\n'
        f"      <td>{taint}</td>\n"
        f'      <td><time datetime="{created.isoformat()}">{created:%Y-%m-%d %H:%M}</time></td>\n'
        f'      <td class="num">{since(run.created_at, run.finished_at)}</td>\n'
        "    </tr>\n"
    )


def old_rows(runs: list[Any]) -> str:
    tz = timezone.get_current_timezone()
    return "".join(old_row(run, tz) for run in runs)
