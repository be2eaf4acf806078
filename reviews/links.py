"""`/reviews/links/<token>/`: an emailed decision link. GET shows the call and the
buttons and changes nothing (mail scanners fetch every link); POST decides, as the
bound reviewer (agents.notifications.links)."""

from __future__ import annotations

import json

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from agents.actions.approvals import DecisionResult
from agents.actions.base import ActionError
from agents.models import DecisionLink
from agents.notifications import links

from . import card_html, cards


@never_cache
@require_http_methods(["GET", "POST"])
def link(request: HttpRequest, token: str) -> HttpResponse:
    found = links.link_find(token)
    if found is None:
        return _page(request, None, message="This link is not valid.", status=404)
    if request.method == "POST":
        decision = request.POST.get("decision", "")
        if decision not in ("approve", "reject"):
            return _page(request, found, message="Choose Approve or Reject.", status=400)
        if links.step_up_required(found, request.user) and not request.user.is_authenticated:
            return redirect_to_login(request.path)
        try:
            result = links.link_decide(
                token=token, user=request.user, decision=decision, note=request.POST.get("note", "")[:2000]
            )
        except links.LinkRefused as exc:
            return _page(request, found, message=exc.why.message, status=exc.why.status)
        except ActionError as exc:
            detail = exc.detail.get("message") if isinstance(exc.detail, dict) else exc.detail
            return _page(request, found, message=f"Nothing was recorded: {detail}", status=exc.status)
        # The page the browser GETs next says what this click did (once: a later visit
        # finds the link spent, and says so).
        request.session[DONE] = {"link": found.pk, "message": what_you_did(result, decision)}
        response = redirect(request.path)
        response.status_code = 303  # See Other: the browser GETs the page, which says what happened
        return response
    done = request.session.pop(DONE, None)
    if isinstance(done, dict) and done.get("link") == found.pk:
        return _page(request, links.link_find(token), message=str(done.get("message", "")), status=200)
    why = links.refusal(found, request.user)
    return _page(request, found, message=why.message if why else "", status=200 if why is None else why.status)


DONE = "airlock_link_done"  # the session's note of the decision this browser just made


def what_you_did(result: DecisionResult, decision: str) -> str:
    """What a successful POST did and what happens next, in the reviewer's words."""
    a = result.approval
    votes = a.current_votes()
    when = a.decided_at or max((v.at for v in votes), default=None) or timezone.now()
    at = f"{timezone.localtime(when):%H:%M %Z}"
    if result.outcome == "decided":
        if decision == "approve":
            return f"You approved this call at {at}; it will run now."
        return f"You rejected this call at {at}; it will not run, and the agent is told it was rejected."
    if result.outcome == "voted":
        counted = sum(1 for v in votes if v.decision == "approve")
        return (
            f"Your vote to {decision} is recorded ({at}): {counted} of {a.required} approvals so far; "
            "the call waits for another reviewer."
        )
    if result.outcome == "already_voted":
        return "You had already voted on this call: nothing changed."
    who = f" by {a.decided_by.get_username()}" if a.decided_by else ""
    return f"Nothing was recorded: this call was already {a.decided_label.lower()}{who}."


def _page(request: HttpRequest, found: DecisionLink | None, *, message: str, status: int) -> HttpResponse:
    a = found.approval if found is not None else None
    context = {
        "link": found,
        "approval": a,
        "message": message,
        "can_answer": found is not None and not message,
        "step_up": found is not None and not message and links.step_up_required(found, request.user),
        "args_json": json.dumps(a.current_args, indent=2, ensure_ascii=False, sort_keys=True) if a else "",
        # What tainted the run, as the queue's card shows it: the passage, flagged.
        "taint_html": card_html.untrusted(taint, a.pk) if a and (taint := cards.taint_of(a)) else "",
        "expired": a is not None and a.status == "expired",
        "login_url": redirect_to_login(request.path).url,
    }
    return render(request, "reviews/link.html", context, status=status)
