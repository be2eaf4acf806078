"""The review queue: pending approvals as cards; decisions go to `approval_decide`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

from agents import access
from agents.actions import claims
from agents.actions.approvals import BatchResult, approval_batch_decide, approval_decide
from agents.actions.base import ActionError
from agents.models import Approval
from agents.web import errors, projects

from . import cards, groups
from . import stats as review_stats
from .forms import BatchForm, DecisionForm, FilterForm, claim_tokens, keep_ids, seen_hashes


def _cursor(request: HttpRequest) -> int | None:
    value = request.GET.get("after", "")
    if not value:
        return None
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses (a 500).
    if not (value.isascii() and value.isdigit()) or int(value) > access.MAX_ID:
        raise cards.BadCursor(f"“after={value[:20]}” in the link is not the number of a call")
    return int(value)


def _grouped_context(request: HttpRequest, filters: Any, *, pending_total: int | None) -> dict[str, Any]:
    """The grouped queue (`?group=1`): groups of calls alike and lone cards, a page at a
    time (`?page=`); it does not poll, so rows a reviewer checked stay checked."""
    if pending_total is None and filters.active:
        pending_total = cards.pending_count(request.user, filters.project)
    number = filters.page
    page = groups.group_page(request.user, filters, page=number, matching=None if filters.active else pending_total)
    query = filters.query()
    return {
        "grouped": True,
        "items": page.items,
        "matching": page.matching,
        "page_number": number,
        "next_query": urlencode({**query, "page": number + 1}) if page.has_next else "",
        "previous_query": urlencode({**query, "page": number - 1}) if number > 1 else "",
        "filters": filters,
        "filter_query": urlencode(query),
        "pending_total": page.matching if pending_total is None else pending_total,
    }


def _queue_context(
    request: HttpRequest, *, pending_total: int | None = None, grouped: bool = True, use_cursor: bool = True
) -> dict[str, Any]:
    """`pending_total`: every pending call the user can see, when the caller counted them.
    `grouped`: the page may be the grouped view (the polled list never is).
    `use_cursor`: False shows the first page whatever `?after=` says (it was refused)."""
    filters = FilterForm(request.GET).filters()
    filters.project = projects.current_id(request)
    if filters.group and grouped:
        return _grouped_context(request, filters, pending_total=pending_total)
    after = _cursor(request) if use_cursor else None
    if pending_total is None and filters.active:
        pending_total = cards.pending_count(request.user, filters.project)
    page = cards.queue(
        request.user,
        filters,
        keep=keep_ids(request.GET.getlist("keep")),
        shown=keep_ids(request.GET.getlist("shown")),
        seen=seen_hashes(request.GET.getlist("seen")),
        claims=claim_tokens(request.GET.getlist("claim")),
        after=after,
        # Unfiltered, the matching count is the pending total: one COUNT, not two.
        matching=None if filters.active else pending_total,
    )
    # How many cards the page holds once this answer is in: an htmx "more" answer adds to
    # them (the same form sent without htmx opens a page of its own).
    loaded = (keep_ids([request.GET.get("loaded", "")]) or [0])[0] if request.htmx and request.GET.get("more") else 0
    loaded += len(page.items)
    return {
        "cards": page.items,
        "matching": page.matching,
        "rest": page.rest,
        "cursor": page.cursor,
        "after": after,
        "next_count": min(page.rest, cards.PAGE),
        "loaded": loaded,
        # Past LOADED_MAX cards the polls would name too many: "more" becomes a new page.
        "append": loaded + cards.PAGE <= cards.LOADED_MAX,
        "filters": filters,
        "filter_query": urlencode(filters.query()),
        "list_query": urlencode({**filters.query(), **({"after": after} if after is not None else {})}),
        "pending_total": page.matching if pending_total is None else pending_total,
    }


def _refusal(exc: cards.BadCursor) -> str:
    return f"{exc}, so this is the first page of the queue instead."


@login_required
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    """The queue page; `?after=<id>` is the page after that card (the "more" form
    without htmx)."""
    return _queue_page(request)


def _queue_page(request: HttpRequest) -> HttpResponse:
    """The whole queue page. A cursor that names no call the viewer can see is said
    inside the page, above its first cards, with a 400, as /runs/ says a wrong filter."""
    # One statement counts the pending calls and names their tools for the filter.
    project = projects.current_id(request)
    total, tools = cards.pending_summary(request.user, project)
    status = 200
    try:
        context = _queue_context(request, pending_total=total)
    except cards.BadCursor as exc:
        context = _queue_context(request, pending_total=total, use_cursor=False)
        context["refused"] = _refusal(exc)
        status = 400
    context["choices"] = cards.filter_choices(tools, request.user, project)
    return render(request, "reviews/queue.html", context, status=status)


@access.login_required_htmx
@require_GET
def queue_list(request: HttpRequest) -> HttpResponse:
    """The list alone, polled by the open queue page (`shown`/`keep`: the cards it has);
    with `more`, the next cards after `after` and the next "more" form, to append."""
    more = bool(request.GET.get("more"))
    try:
        context = _queue_context(request, grouped=False)
    except cards.BadCursor as exc:
        if not request.htmx:
            # The fragment's URL opened as a page (a copied link): the whole queue page,
            # which says what was wrong inside itself.
            return _queue_page(request)
        # htmx swaps only a 2xx answer: the refusal is the fragment, swapped in where
        # the "more" form was (it replaces no cards), or above the first page (a poll).
        context = _queue_context(request, grouped=False, use_cursor=False)
        context["refused"] = _refusal(exc)
        if more:
            return render(request, "reviews/queue.html#refused", context)
        context["list_refused"] = True
    return render(request, "reviews/queue.html#" + ("page" if more else "list"), context)


@access.login_required_htmx
@require_GET
def badge(request: HttpRequest) -> HttpResponse:
    return render(request, "reviews/queue.html#badge", {"pending_total": cards.pending_count(request.user, projects.current_id(request))})


@login_required
@require_GET
def stats(request: HttpRequest) -> HttpResponse:
    """How reviewing goes over `?days=1|7|30|90` (default 7): operators and reviewers.
    A window that is none of those is said inside the page, above the default window's
    figures, with a 400, as the queue says a wrong `after`."""
    if not access.reads_review_stats(request.user):
        raise PermissionDenied("only operators and reviewers read the review statistics")
    refused, status = "", 200
    try:
        days = review_stats.window_days(request.GET.get("days"))
    except review_stats.BadWindow as exc:
        days, status = review_stats.DEFAULT_DAYS, 400
        refused = f"Invalid window: {exc}, so these are the last {days} days instead."
    figures = review_stats.stats(request.user, days=days)
    context = {"stats": figures, "windows": review_stats.WINDOWS, "refused": refused}
    return render(request, "reviews/stats.html", context, status=status)


@login_required
@require_GET
def approval(request: HttpRequest, approval_id: int) -> HttpResponse:
    """One approval in any status, where every notification links: the queue's card
    (with its buttons while it is pending), every vote of every round, and its run.
    An approval the viewer may not see is a 404 exactly like a missing one."""
    card = cards.card(request.user, approval_id) if 0 < approval_id <= access.MAX_ID else None
    if card is None:
        # Hidden or missing, the same 404; only the denial log line tells them apart.
        hidden = 0 < approval_id <= access.MAX_ID and Approval.objects.filter(pk=approval_id).exists()
        raise (access.RunHidden if hidden else Http404)(f"no approval {approval_id}")
    run = access.readable_run(request.user, card.approval.run_id)
    context = {
        "card": card,
        "run": run,
        "votes": cards.all_votes(card.approval),
        "can_decide": access.may_decide(request.user, card.approval),
        "on_own_page": True,
    }
    return render(request, "reviews/approval.html", context)


def _back_to_queue(request: HttpRequest) -> str:
    # The decision forms carry the page's filters so the redirect lands on the same view.
    filters = FilterForm(request.POST).filters()
    query = urlencode(filters.query())
    return reverse("reviews:queue") + (f"?{query}" if query else "")


def _summary(card: cards.Card, outcome: str, *, me: Any) -> str:
    a = card.approval
    if outcome == "decided":
        return f"{card.decided_label}: {a.tool} for run {a.run_id}."
    if outcome == "voted":
        return f"Your vote is recorded: {card.approvals} of {a.required} approvals."
    if outcome == "already_voted":
        return "You had already voted on this call: nothing changed."
    if a.decided_by_id == me.pk:
        return f"You had already answered: {card.decided_label.lower()}."
    if card.decided_by:
        return f"Your answer was not recorded: {card.decided_by} decided first ({card.decided_label.lower()})."
    why = "the run ended" if a.run.is_terminal else "nobody answered in time"
    return f"Your answer was not recorded: this call is {a.status} ({why})."


def _respond(request: HttpRequest, card: cards.Card, *, ok: bool) -> HttpResponse:
    """The card again for htmx; a redirect to the queue (or to the approval's own page,
    when the answer came from there) with the message otherwise."""
    own_page = request.POST.get("back") == "approval"
    if not request.htmx:
        (messages.success if ok else messages.warning)(request, card.message)
        back = reverse("reviews:approval", args=[card.approval.pk]) if own_page else _back_to_queue(request)
        response = redirect(back)
        response.status_code = 303  # See Other: the browser GETs the page
        return response
    return render(request, "reviews/queue.html#card", {"card": card, "can_decide": True, "on_own_page": own_page})


def _refused_edit(request: HttpRequest, approval_id: int, why: str) -> HttpResponse:
    # The card comes back with the editor open on what the reviewer typed, and why.
    card = cards.card(request.user, approval_id)
    if card is None:
        raise Http404("approval not visible")
    card.edit_error = card.message = f"Not approved: {why}"
    card.edit_text = request.POST.get("args", "")
    return _respond(request, card, ok=False)


def _call_changed(request: HttpRequest, approval_id: int, exc: ActionError) -> HttpResponse:
    """The card again, with the call as it stands now and why nothing was recorded: a
    409 (reviews.js swaps it in), or without htmx the queue, which shows it fresh."""
    card = cards.card(request.user, approval_id)
    if card is None:
        raise Http404("approval not visible")
    card.call_changed(refused=True)
    card.message = card.changed
    if not request.htmx:
        messages.warning(request, card.message)
        response = redirect(_back_to_queue(request))
        response.status_code = 303
        return response
    return render(request, "reviews/queue.html#card", {"card": card, "can_decide": True}, status=409)


def _edit_refusal(exc: ActionError) -> str:
    detail = exc.detail
    if isinstance(detail, dict):
        rule = detail.get("rule")
        named = f" (rule: {rule.get('reason')})" if isinstance(rule, dict) and rule.get("reason") else ""
        return f"{detail.get('message', exc.code)}{named}"
    return f"{exc.code}: {detail}"


@access.login_required_htmx
@require_POST
def decide(request: HttpRequest, approval_id: int, decision: str) -> HttpResponse:
    if not access.can_decide(request.user):
        raise PermissionDenied("only reviewers decide approvals")
    form = DecisionForm(request.POST)
    if not form.is_valid():
        if "args" in form.errors and len(form.errors) == 1:
            return _refused_edit(request, approval_id, form.errors["args"][0])
        return errors.error_page(request, 400, f"invalid decision: {form.errors.as_text()}")
    try:
        result = approval_decide(
            approval_id=approval_id,
            user=request.user,
            decision=decision,
            note=form.cleaned_data["note"],
            args=form.cleaned_data["args"],
            remember=form.cleaned_data["remember"] or None,
            args_hash=form.cleaned_data["args_hash"] or None,
            via="dashboard",
            by_reviewer=True,
        )
    except ActionError as exc:
        if exc.status == 404:
            raise Http404(str(exc.detail)) from None
        if exc.code == "call_changed":
            return _call_changed(request, approval_id, exc)
        if exc.code in ("invalid_arguments", "denied_by_policy"):
            return _refused_edit(request, approval_id, _edit_refusal(exc))
        if not request.htmx and exc.status in errors.TITLES:
            # A form posted without htmx (the approval's page without JS) gets the error
            # page, in the layout with a way back, not a bare line of text.
            return errors.error_page(request, exc.status, str(exc.detail))
        # htmx: reviews.js shows the text in the card's form.
        return HttpResponse(str(exc.detail), status=exc.status, content_type="text/plain")
    late = result.outcome == "late"
    card = cards.card(request.user, result.approval.pk, late=late)
    if card is None:
        raise Http404("approval not visible")
    card.message = _summary(card, result.outcome, me=request.user)
    response = _respond(request, card, ok=not late)
    if request.htmx and result.outcome in ("decided", "late"):
        # `status`: what the keyboard's live region announces ("Approved call 12").
        detail = {"id": card.approval.pk, "won": result.won, "status": card.approval.status}
        trigger_client_event(response, "approvalDecided", detail)
    return response


@access.login_required_htmx
@require_POST
def claim(request: HttpRequest, approval_id: int, action: str) -> HttpResponse:
    """Claim a pending call ("I'm on it"), or release the claim (`action`). For htmx the
    card's claim line again (a refusal, such as another reviewer's claim, as a 409 with
    the line as it stands); without htmx a redirect back, with the message."""
    do = claims.approval_claim if action == "claim" else claims.approval_release
    ok = True
    try:
        approval = do(approval_id=approval_id, user=request.user)
    except ActionError as exc:
        if exc.status == 404:
            raise Http404(str(exc.detail)) from None
        if exc.status == 403:
            raise PermissionDenied(str(exc.detail)) from None
        ok, message = False, exc.detail["message"] if isinstance(exc.detail, dict) else str(exc.detail)
    else:
        if action == "release":
            message = f"Released call {approval_id}."
        else:
            until = timezone.localtime(approval.claimed_until) if approval.claimed_until else None
            message = f"Claimed call {approval_id}" + (f" until {until:%H:%M}." if until else ".")
    card = cards.card(request.user, approval_id)
    if card is None:
        raise Http404("approval not visible")
    if not request.htmx:
        (messages.success if ok else messages.warning)(request, message)
        own_page = request.POST.get("back") == "approval"
        response = redirect(reverse("reviews:approval", args=[approval_id]) if own_page else _back_to_queue(request))
        response.status_code = 303
        return response
    if card.claim is not None:
        card.claim.message = message
    context = {"card": card, "can_decide": True, "on_own_page": request.POST.get("back") == "approval",
               "filters": FilterForm(request.POST).filters()}
    response = render(request, "reviews/queue.html#claim", context, status=200 if ok else 409)
    trigger_client_event(response, "approvalClaimed", {"id": approval_id, "ok": ok, "message": message})
    return response


@dataclass
class BatchAnswer:
    """What a group card's form is answered with: each call's result, and what is left
    of the group (itself, the one call left as its card, or nothing)."""

    results: list[BatchResult]
    items: list[groups.Group | cards.Card]
    key: str
    line: str  # the summary: "Approve selected: 2 decided."


@access.login_required_htmx
@require_POST
def decide_batch(request: HttpRequest) -> HttpResponse:
    """Approve or reject the calls checked on a group card, with one note: exactly the
    ids it posted, each bound to the args_hash its row showed, each decided on its own
    through `approval_decide` (approval_batch_decide). The group again, under the
    per-call results, for htmx; without htmx, a redirect to the queue saying the same."""
    if not access.can_decide(request.user):
        raise PermissionDenied("only reviewers decide approvals")
    form = BatchForm(request.POST)
    if not form.is_valid():
        return errors.error_page(request, 400, f"invalid batch: {form.errors.as_text()}")
    ids, seen = form.picked(request.POST)
    key = form.cleaned_data["group_key"]
    filters = FilterForm(request.POST).filters()
    filters.project = projects.current_id(request)
    if not ids:
        results: list[BatchResult] = []
        line = "Nothing was decided: check the calls to decide first."
    else:
        results = approval_batch_decide(
            approval_ids=ids, user=request.user, decision=form.cleaned_data["decision"],
            note=form.cleaned_data["note"], args_hashes={i: seen[i] for i in ids if i in seen}, require_hashes=True,
            via="dashboard",
        )
        line = f"{form.cleaned_data['decision'].capitalize()} selected: {groups.summary(results)}."
    if not request.htmx:
        details = "; ".join(f"#{r.id} {groups.OUTCOME_LABELS[r.outcome]}: {r.detail}" for r in results)
        ok = bool(results) and all(r.outcome in ("decided", "needs_more_votes") for r in results)
        (messages.success if ok else messages.warning)(request, f"{line} {details}".strip())
        query = urlencode({**filters.query(), "group": "1"})
        response = redirect(reverse("reviews:queue") + f"?{query}")
        response.status_code = 303  # See Other: the browser GETs the page
        return response
    left = groups.group_of(request.user, key, filters) if key else None
    answer = BatchAnswer(results, [left] if left else [], key, line)
    # The header's count, as it stands after the batch (sent out of band).
    matching = groups.pending_calls(request.user, filters).count()
    context = {
        "answer": answer, "can_decide": True, "filters": filters, "count_oob": True, "matching": matching,
        "pending_total": cards.pending_count(request.user, filters.project) if filters.active else matching,
        "filter_query": urlencode({**filters.query(), "group": "1"}),
    }
    response = render(request, "reviews/queue.html#batch_answer", context)
    if any(r.outcome == "decided" for r in results):
        trigger_client_event(response, "approvalDecided", {"ids": [r.id for r in results if r.outcome == "decided"]})
    return response
