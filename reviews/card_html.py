"""A review card as HTML: the queue's repeated fragment, built in Python.

The queue shows 25 cards; through the template engine each cost about 250 µs (every
variable, filter, `{% if %}` and `{% url %}` is a node to resolve), most of the page's
time. Here a card is a few string joins, about 16 µs. Everything a model, a tool or a
person produced (the task, arguments, reasons, fetched text, notes, names) goes through
`esc` (agents/web/markup.py), which escapes it as the template's autoescape did: it stays
inert text. The page around the cards stays in reviews/queue.html, whose `card` partial
calls this through the `review_card` tag, so an htmx decision still renders
"reviews/queue.html#card".
"""

from __future__ import annotations

import functools
import unicodedata
from datetime import datetime

from django.template import Context
from django.template.defaulttags import CsrfTokenNode
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from agents.engine.decisions import DECISIONS
from agents.web.markup import esc, plural, url_for

from .cards import Card, OnScreen, Quorum, ToolSource
from .untrusted import Untrusted

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
            f"server's annotations claim {esc(source.claimed_risk)})."
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
            f'aria-controls="approval-{pk}-edit">Edit arguments</button>\n'
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


def card(card: Card, context: Context) -> SafeString:
    """The card of one approval; `context` gives the viewer's rights (`can_decide`), the
    queue's `filters` (kept through a decision), `preserve` and the CSRF token."""
    return mark_safe(_card(card, _Shared(context, preserve=bool(context.get("preserve")))))


def cards(items: list[Card | OnScreen], context: Context) -> SafeString:
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
        f"</header>{changed}\n"
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
