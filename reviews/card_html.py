"""The review cards, from the Jinja2 templates reviews/jinja2/reviews/cards.html (the
loop) and card.html (a card's parts, a macro each).

The queue shows 25 cards; through the Django template engine each cost about 250 µs
(every variable, filter, `{% if %}` and `{% url %}` is a node to resolve), most of the
page's time. Jinja2 compiles the templates to Python and escapes every value unless a
template says otherwise (agents/web/jinja.py): everything a model, a tool or a person
produced (the task, arguments, reasons, fetched text, notes, names) stays inert text. The
page around the cards stays in reviews/queue.html, whose `card` partial calls this through
the `review_card` tag, so an htmx decision still renders "reviews/queue.html#card".
"""

from __future__ import annotations

from typing import Any

from django.template import Context
from django.template.defaulttags import CsrfTokenNode
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from agents.actions.approvals import BatchResult
from agents.web.jinja import fragment

from .cards import Card, OnScreen
from .groups import OUTCOME_LABELS, Group
from .untrusted import Untrusted


def _shared(context: Context) -> dict[str, Any]:
    filters = context.get("filters")
    return {
        "can_decide": bool(context.get("can_decide")),  # the viewer may answer
        # The queue's filters as hidden inputs: a decision keeps them. On the approval's
        # own page the decision comes back to that page, not the queue.
        "own_page": bool(context.get("on_own_page")),
        "hidden": list(filters.query().items()) if filters else [],
        "csrf": CsrfTokenNode().render(context),  # already safe
        "tz": timezone.get_current_timezone(),  # as the `date` filter shows times
    }


def untrusted(taint: Untrusted, pk: int) -> SafeString:
    """The untrusted passage as a card shows it (highlighted, with its source step)."""
    return fragment("reviews/untrusted.html", {"t": taint, "pk": pk, "tz": timezone.get_current_timezone()})


def claim(card: Card, context: Context) -> SafeString:
    """A card's claim line alone (the answer to Claim and Release)."""
    if card.claim is None:
        return SafeString("")
    return fragment("reviews/claim.html", {**_shared(context), "cl": card.claim})


def _render(items: list[Card | OnScreen], context: Context, *, preserve: bool) -> SafeString:
    return fragment("reviews/cards.html", {**_shared(context), "items": items, "preserve": preserve})


def card(card: Card, context: Context) -> SafeString:
    """The card of one approval; `context` gives the viewer's rights (`can_decide`), the
    queue's `filters` (kept through a decision), `preserve` and the CSRF token."""
    return _render([card], context, preserve=bool(context.get("preserve")))


def cards(items: list[Card | OnScreen], context: Context) -> SafeString:
    """The list's cards, each kept by the page when it is there (hx-preserve); a card
    the polling page already shows comes as an empty stand-in, with its vote counter
    out of band."""
    return _render(items, context, preserve=True)


def groups(
    items: list[Group | Card], context: Context, *, results: list[BatchResult] | None = None, line: str = "",
    key: str = "",
) -> SafeString:
    """The grouped queue's entries (reviews/jinja2/reviews/group.html); with `results`,
    a batch's answer: what became of each call, above what is left of group `key`.
    Nothing is preserved: the grouped page does not poll (checked rows would be lost)."""
    shared = {**_shared(context), "items": items, "preserve": False}
    shared.update(
        action=reverse("reviews:decisions"), results=results or [], line=line, answer_key=key,
        labels=OUTCOME_LABELS,
    )
    return fragment("reviews/group.html", shared)
